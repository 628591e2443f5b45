"""The state a serving process reads on each review: policy, GPU nodes, readiness.

Owns the live policy (a file re-read when it changes: the kubelet updates a
mounted ConfigMap by swapping a symlink, which changes the resolved file's
inode and mtime) (the seam through which node facts reach the decision is
``webhook.decision.capacity.NodeSource``).
Every gunicorn worker holds its own copy and checks the file itself, at
most once per ``interval``, so a change reaches all workers with no
signalling between them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from webhook.decision.policy import DEFAULT_POLICY, Policy, parse_policy_text
from webhook.errors import PolicyError

log = logging.getLogger("gpushare_webhook.policy")
# prometheus-client reads this when first imported, to share counts between processes.
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def read_policy_text(path: Path) -> str:
    """The text of a policy file; a failure to read it is a PolicyError naming the file."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(f"{path}: no such policy file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise PolicyError(f"{path}: cannot read the policy: {error}") from None


def read_policy(path: Path) -> Policy:
    """Read and parse a policy file; every failure is a PolicyError naming the file."""
    return parse_policy_text(read_policy_text(path), source=str(path))


class PolicySource:
    """The policy in force, from a file (reloaded when it changes) or the defaults."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        interval: float = 1.0,
        on_change: Callable[[PolicySource], None] | None = None,
    ) -> None:
        self.path = path
        self.interval = interval
        self.on_change = on_change
        self._lock = threading.Lock()
        self._checked = time.monotonic()
        self.error = ""
        self.reloads = 0
        self.failures = 0
        if path is None:
            self._policy, self._digest = DEFAULT_POLICY, ""
        else:
            text = read_policy_text(path)
            self._policy = parse_policy_text(text, source=str(path))  # errors stop start-up
            self._digest = hashlib.sha256(text.encode()).hexdigest()
        self.loaded_at = time.time()

    @property
    def stale(self) -> bool:
        """True when the file holds a policy that could not be applied."""
        return bool(self.error)

    @property
    def digest(self) -> str:
        return self._digest[:12]

    def get(self) -> Policy:
        if self.path is not None and time.monotonic() - self._checked >= self.interval:
            self.refresh()
        return self._policy

    def refresh(self) -> bool:
        """Re-read the file now; True when a new policy took effect."""
        if self.path is None:
            return False
        with self._lock:
            self._checked = time.monotonic()
            try:
                text = read_policy_text(self.path)
                digest = hashlib.sha256(text.encode()).hexdigest()
                if digest == self._digest and not self.error:
                    return False
                policy = parse_policy_text(text, source=str(self.path))
            except PolicyError as error:
                if str(error) != self.error:
                    log.error("policy not reloaded, keeping the last good one: %s", error)
                    self.failures += 1
                self.error = str(error)
                return False
            changed = digest != self._digest
            self._policy, self._digest, self.error = policy, digest, ""
            if changed:
                self.reloads += 1
                self.loaded_at = time.time()
                log.info("policy reloaded from %s (sha256 %s)", self.path, self.digest)
        if changed and self.on_change is not None:
            self.on_change(self)
        return changed


def prepare_metrics_directory() -> Path | None:
    """Make (or empty) the directory the workers share their counts in, and export it.

    Counts from an earlier run must not leak into this one, so the files are
    removed at start. Returns the directory when it is ours to remove at
    exit (none was given), else None. Ours lives in memory when it can.
    """
    given = os.environ.get(METRICS_ENV)
    if given:
        directory = Path(given)
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink()
        return None
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    directory = Path(tempfile.mkdtemp(prefix="gpushare-metrics-", dir=base))
    os.environ[METRICS_ENV] = str(directory)
    return directory
