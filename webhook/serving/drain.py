"""The drain: on SIGTERM, keep answering for a while with readiness failing, then stop.

The API server sends a call to a replica's address until that address has
left every path to it (the EndpointSlice, kube-proxy's rules, the API
server's own service resolution), which takes a few seconds after the pod
is marked terminating. gunicorn stops accepting the moment it gets SIGTERM,
so every call in that window would be refused: a failed pod create each.

Here the arbiter, on its first SIGTERM, raises a flag that every worker
sees (a file in memory: the workers are processes), keeps serving for
``drain`` seconds, and only then runs gunicorn's own graceful stop (stop
accepting, finish what is in flight, close kept-alive connections). While
the flag is up, ``/readyz`` fails and every answer says ``Connection:
close``, so the API server's kept-alive connections, which a Service's
connection tracking keeps pinned to this replica, are closed by the client
after its answer and the next call dials a replica that stays. A second
SIGTERM, or SIGINT or SIGQUIT, stops at once.

This rests on gunicorn's arbiter and request internals, listed in
:data:`DRAIN_INTERNALS` and checked by tests/test_worker_contract.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gunicorn.arbiter import Arbiter

DEFAULT_DRAIN = 5.0

# (where, name, the parameters it must take or None for an attribute), as
# webhook.serving.worker.GUNICORN_INTERNALS.
DRAIN_INTERNALS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("gunicorn.arbiter.Arbiter", "handle_term", ("self",)),
    ("gunicorn.arbiter.Arbiter", "manage_workers", ("self",)),
    ("gunicorn.arbiter.Arbiter", "wait_for_signals", ("self", "timeout")),
    ("gunicorn.http.message.Message", "must_close", None),
)


class DrainFlag:
    """Up while the server drains; raised by the arbiter, read by every worker.

    A file's existence: one ``stat`` per read, seen by the forked workers
    with no signalling between processes.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def raise_(self) -> None:
        self.path.touch()

    def __call__(self) -> bool:
        return self.path.exists()


def close_while_draining(flag: DrainFlag) -> Any:
    """gunicorn's ``pre_request`` hook: while draining, answer with ``Connection: close``."""

    def pre_request(_worker: Any, req: Any) -> None:
        if flag():
            req.must_close = True

    return pre_request


class DrainingArbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's arbiter, whose first SIGTERM starts a drain instead of the stop."""

    drain: float = DEFAULT_DRAIN
    flag: DrainFlag | None = None
    _until: float | None = None

    def handle_term(self) -> None:
        if self._until is not None or self.drain <= 0:
            raise StopIteration  # the second SIGTERM, or no drain: gunicorn's stop
        self._until = time.monotonic() + self.drain
        if self.flag is not None:
            self.flag.raise_()
        self.log.info(
            "draining: readiness fails, calls are answered for %gs more, then the server stops",
            self.drain,
        )

    def wait_for_signals(self, timeout: float = 1.0) -> list[int]:
        if self._until is not None:
            timeout = max(0.0, min(timeout, self._until - time.monotonic()))
        signals: list[int] = super().wait_for_signals(timeout)
        return signals

    def manage_workers(self) -> None:
        if self._until is not None and time.monotonic() >= self._until:
            self.log.info("drain over: stopping")
            raise StopIteration  # caught by Arbiter.run, which then halts gracefully
        super().manage_workers()


def draining_arbiter(drain: float, flag: DrainFlag | None) -> type[DrainingArbiter]:
    return type("DrainingArbiter", (DrainingArbiter,), {"drain": drain, "flag": flag})
