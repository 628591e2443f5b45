"""One node watch per server, in a process of its own, shared with the workers as a file.

A watch in every gunicorn worker cost each of them the kubernetes client
(about 20 MiB) and the API server one watch per worker. Instead, ``serve
--watch-nodes`` forks one watch process just before gunicorn starts, while
the serving process still has one thread. Only that process imports the
client; whenever what it knows changes (looked at every ``interval``), it
replaces a snapshot file whole (``webhook.decision.nodesource.encode_snapshot``),
and the workers read that file as they read the policy
(``webhook.serving.nodefile``).

The watch never gives up on the API (it backs off and lists again), so it
ends only when the serving process stops it, when that process is gone
(it checks its parent), or when it cannot run at all: no usable credentials,
which it says in the snapshot before it exits with ``EXIT_FATAL``, and
``serve`` stops at start in one line. Were it killed anyway (the kernel's
OOM killer), the nodes known before stay in force, the workers' status says
the watch stopped, and ``/healthz`` fails, so the kubelet restarts the
server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import logging.config
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.decision import NodeFacts, NodeStatus, decode_snapshot, encode_snapshot
from webhook.errors import KubeError, SnapshotError

log = logging.getLogger("gpushare_webhook.nodes")
EXIT_FATAL = 2  # the watch cannot run with these settings


@dataclass(frozen=True)
class WatchOptions:
    kubeconfig: str | None = None
    context: str | None = None
    label_selector: str = ""
    # Seconds between looks at what the watch knows; at least the file clock's
    # tick, so each replaced snapshot has its own mtime (webhook.serving.reload).
    interval: float = 0.25


class NodeWatch:
    """The node watch, as the serving process sees it.

    Made before the app (it writes a first snapshot, "not read yet", so
    the workers' view of the file exists from the start), started as late
    as possible: the process forked then shares more of this one's memory.
    """

    def __init__(self, snapshot: Path, options: WatchOptions) -> None:
        self.snapshot, self.options = snapshot, options
        self.pid = 0
        _write(snapshot, NodeStatus(watching=True, problem="node list not read yet"), ())

    def start(self, log_config: dict[str, Any] | None = None) -> None:
        """Start the watch, a new interpreter running this module, logging as ``log_config``."""
        o = self.options
        argv = [sys.executable, "-m", __name__, "--snapshot", str(self.snapshot)]
        argv += ["--parent", str(os.getpid()), "--interval", str(o.interval)]
        argv += ["--node-selector", o.label_selector]
        argv += ["--kubeconfig", o.kubeconfig] if o.kubeconfig else []
        argv += ["--context", o.context] if o.context else []
        argv += ["--log-config", json.dumps(log_config)] if log_config else []
        pid = subprocess.Popen(argv, stdin=subprocess.DEVNULL).pid
        self.pid = pid
        selector = self.options.label_selector or "every node"
        log.info("node watch started", extra={"fields": {"pid": pid, "nodes": selector}})

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (or its pid reused by another user)
            return False
        return True

    def wait_first(self, timeout: float = 5.0) -> NodeStatus | None:
        """Wait up to ``timeout`` for the first list to be answered; KubeError if it cannot run.

        Returns the status then (None when nothing was written in time: the
        server starts anyway, and reviews fall back to the policy until the
        nodes arrive). Call it before gunicorn starts: it reaps the process
        if it ended.
        """
        deadline = time.monotonic() + timeout
        while True:
            status = self._read()
            if status is not None and status.fatal:
                raise KubeError(status.fatal)
            if status is not None and status.tried:
                return status
            done, code = _ended(self.pid)
            if done:
                raise KubeError(f"the node watch process ended at start ({_described(code)})")
            if time.monotonic() >= deadline:
                return status
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> None:
        if not self.pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while not _ended(self.pid)[0]:
            if time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
                return
            time.sleep(0.02)

    def _read(self) -> NodeStatus | None:
        try:
            return decode_snapshot(self.snapshot.read_bytes())[0]
        except (OSError, SnapshotError):
            return None


def _ended(pid: int) -> tuple[bool, int]:
    """Whether child ``pid`` has ended, and its exit code if this call reaped it."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped already (gunicorn's arbiter reaps every child)
        return True, 0
    return (True, os.waitstatus_to_exitcode(status)) if done else (False, 0)


def _described(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def main(argv: list[str] | None = None) -> int:
    """The watch process: ``python -m webhook.cluster.watchprocess`` (started by NodeWatch)."""
    parser = argparse.ArgumentParser(prog="python -m webhook.cluster.watchprocess")
    parser.add_argument("--snapshot", type=Path, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--interval", type=float, default=WatchOptions.interval)
    parser.add_argument("--node-selector", default="")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    parser.add_argument("--log-config")
    args = parser.parse_args(argv)
    if args.log_config:
        logging.config.dictConfig(json.loads(args.log_config))
    options = WatchOptions(args.kubeconfig, args.context, args.node_selector, args.interval)
    try:
        return _watch(args.snapshot, options, args.parent)
    except BaseException:
        log.exception("node watch failed")
        return 1


def _watch(snapshot: Path, options: WatchOptions, parent: int) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C and SIGHUP are the serving process's to act on; it stops this one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from webhook.cluster import informer, kube

    try:
        kube.api_client(options.kubeconfig, options.context)
    except KubeError as error:
        _write(snapshot, NodeStatus(watching=True, tried=True, fatal=str(error)), ())
        return EXIT_FATAL
    watcher = informer.NodeWatcher(
        lambda: kube.api_client(options.kubeconfig, options.context, retries=0),
        label_selector=options.label_selector,
    )
    watcher.start()
    written = -1
    try:
        while True:
            version, status, facts = watcher.snapshot()
            if version != written:
                _write(snapshot, status, facts)
                written = version
            if stop.wait(options.interval) or os.getppid() != parent:
                return 0
    finally:
        watcher.stop(timeout=1.0)


def _write(path: Path, status: NodeStatus, facts: Iterable[NodeFacts]) -> None:
    """Replace the snapshot whole: a reader sees the old file or the new one, never half."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(encode_snapshot(status, facts))
    os.replace(partial, path)


if __name__ == "__main__":
    raise SystemExit(main())
