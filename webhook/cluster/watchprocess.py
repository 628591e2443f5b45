"""One node watch per server, in a process of its own, shared with the workers as a file.

A watch in every gunicorn worker cost each of them the kubernetes client
(about 20 MiB) and the API server one watch per worker. Instead, ``serve
--watch-nodes`` forks one watch process just before gunicorn starts, while
the serving process still has one thread. Only that process imports the
client; whenever what it knows changes (looked at every ``interval``), it
replaces a snapshot file whole (``webhook.decision.nodesource.encode_snapshot``),
and the workers read that file as they read the policy
(``webhook.serving.nodefile``).

Beside the Nodes it follows what ``scheduler: dra`` reads: the
ResourceSlices (the GPUs drivers publish) and the DeviceClasses (one whose
``extendedResourceName`` is one of the policy's resources is said in a log
line), both written into the snapshot; a cluster without
resource.k8s.io/v1, or RBAC that refuses it, is said once and the Nodes
go on alone. It also makes the claim templates pending pods name
(``webhook.cluster.templates``), with the served policy's ``dra`` section,
re-read when the policy file changes; what it made and failed to make it
counts in a small JSON file beside the snapshot (``NodeWatch.counts``),
which the workers' /metrics reads.

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

from webhook.decision import (
    DEFAULT_POLICY,
    NO_DRA,
    DraFacts,
    NodeFacts,
    NodeStatus,
    Policy,
    decode_snapshot,
    encode_snapshot,
    parse_policy_text,
)
from webhook.errors import KubeError, PolicyError, SnapshotError

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
    policy: str | None = None  # the served policy's file, for the claim templates' shape


class NodeWatch:
    """The node watch, as the serving process sees it.

    Made before the app (it writes a first snapshot, "not read yet", so
    the workers' view of the file exists from the start), started as late
    as possible: the process forked then shares more of this one's memory.
    """

    def __init__(self, snapshot: Path, options: WatchOptions) -> None:
        self.snapshot, self.options = snapshot, options
        self.counts = counts_path(snapshot)
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
        argv += ["--policy", o.policy] if o.policy else []
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
    parser.add_argument("--policy")
    parser.add_argument("--log-config")
    args = parser.parse_args(argv)
    if args.log_config:
        logging.config.dictConfig(json.loads(args.log_config))
    options = WatchOptions(
        args.kubeconfig, args.context, args.node_selector, args.interval, args.policy
    )
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
    from webhook.cluster import kube
    from webhook.cluster.watches import Watches

    try:
        kube.api_client(options.kubeconfig, options.context)
    except KubeError as error:
        _write(snapshot, NodeStatus(watching=True, tried=True, fatal=str(error)), ())
        return EXIT_FATAL
    policy = PolicyFile(Path(options.policy) if options.policy else None)
    watches = Watches(
        lambda: kube.api_client(options.kubeconfig, options.context, retries=0),
        options.label_selector,
        policy.get,
    )
    watches.start()
    written: object = None
    counted: object = None
    try:
        while True:
            policy.refresh()
            watches.said_mapped(policy.get())
            watches.retry()
            version = watches.version()
            if version != written and watches.ready():
                status, facts, dra = watches.snapshot()
                _write(snapshot, status, facts, dra)
                written = version
            counts = watches.counts()
            if counts != counted:
                _replace(counts_path(snapshot), json.dumps(counts).encode())
                counted = counts
            if stop.wait(options.interval) or os.getppid() != parent:
                return 0
    finally:
        watches.stop(timeout=1.0)


class PolicyFile:
    """The served policy, for the templates' shape: re-read when the file's bytes change.

    A file that cannot be read or parsed keeps the last good policy (the
    workers say why; this says it once per change of the file).
    """

    def __init__(self, path: Path | None, *, interval: float = 1.0) -> None:
        self.path, self.interval = path, interval
        self._policy, self._bytes, self._checked = DEFAULT_POLICY, b"", -interval
        self.refresh()

    def get(self) -> Policy:
        return self._policy

    def refresh(self) -> None:
        now = time.monotonic()
        if self.path is None or now - self._checked < self.interval:
            return
        self._checked = now
        try:
            data = self.path.read_bytes()
        except OSError:
            return  # a moment in a ConfigMap's swap; the next look finds it
        if data == self._bytes:
            return
        self._bytes = data
        try:
            self._policy = parse_policy_text(data.decode("utf-8"), source=str(self.path))
        except (PolicyError, UnicodeDecodeError) as error:
            log.warning("claim templates keep the last good policy: %s", error)


def counts_path(snapshot: Path) -> Path:
    """Beside the snapshot, ``{"created": n, "failures": n}``: the claim templates made,
    and the creates refused."""
    return snapshot.with_name("templates.json")


def _write(
    path: Path, status: NodeStatus, facts: Iterable[NodeFacts], dra: DraFacts = NO_DRA
) -> None:
    """Replace the snapshot whole: a reader sees the old file or the new one, never half."""
    _replace(path, encode_snapshot(status, facts, dra))


def _replace(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


if __name__ == "__main__":
    raise SystemExit(main())
