"""The policy a serving process reads on each review, and the folders its processes share.

Owns the live policy (a file re-read when its bytes change, the last good
policy kept while it is broken; see ``webhook.serving.reload``), the
metrics folder prometheus-client's processes share, and the private
runtime folder of one ``serve``. Every gunicorn worker holds its own
policy and checks the file itself, at most once per ``interval``, so a
change reaches all workers with no signalling between them. Node facts
reach the decision through ``webhook.decision.NodeSource``
(``webhook.serving.nodefile``).
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

from webhook.decision import DEFAULT_POLICY, Policy, parse_policy_text
from webhook.errors import PolicyError
from webhook.serving.reload import WatchedFiles

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
    """The policy in force, from a file (reloaded when it changes) or the defaults.

    The file is watched by ``webhook.serving.reload.WatchedFiles``, the same
    rule the certificate pair follows: a broken file keeps the last good
    policy in force and shows as ``stale`` until it is fixed.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        interval: float = 1.0,
        on_change: Callable[[PolicySource], None] | None = None,
    ) -> None:
        self.path = path
        self.on_change = on_change
        self._file: WatchedFiles[tuple[Policy, str]] | None = None
        if path is not None:
            self._file = WatchedFiles(  # errors stop start-up
                [path],
                lambda: _load(path),
                errors=(PolicyError,),
                interval=interval,
                on_error=lambda error: log.error(
                    "policy not reloaded, keeping the last good one: %s", error
                ),
            )
        self._policy, self._digest = self._file.value if self._file else (DEFAULT_POLICY, "")
        self._lock = threading.Lock()
        self.reloads = 0
        self.loaded_at = time.time()

    @property
    def stale(self) -> bool:
        """True when the file holds a policy that could not be applied."""
        return bool(self.error)

    @property
    def error(self) -> str:
        return self._file.error if self._file else ""

    @property
    def failures(self) -> int:
        return self._file.failures if self._file else 0

    @property
    def digest(self) -> str:
        return self._digest[:12]

    def get(self) -> Policy:
        if self._file is not None:
            self._take(self._file.get())
        return self._policy

    def refresh(self) -> bool:
        """Re-read the file now; True when a new policy took effect."""
        return self._file is not None and self._file.refresh() and self._take(self._file.value)

    def _take(self, loaded: tuple[Policy, str]) -> bool:
        policy, digest = loaded
        with self._lock:  # the file's value changes once; only one thread reports it
            if digest == self._digest:
                return False
            self._policy, self._digest = policy, digest
            self.reloads += 1
            self.loaded_at = time.time()
        log.info("policy reloaded from %s (sha256 %s)", self.path, self.digest)
        if self.on_change is not None:
            self.on_change(self)
        return True


def _load(path: Path) -> tuple[Policy, str]:
    text = read_policy_text(path)
    return parse_policy_text(text, source=str(path)), hashlib.sha256(text.encode()).hexdigest()


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
    directory = runtime_dir("gpushare-metrics-")
    os.environ[METRICS_ENV] = str(directory)
    return directory


def runtime_dir(prefix: str) -> Path:
    """A new directory for files the server's processes share, in memory when it can be.

    The webhook's pod has a read-only root file system; /dev/shm is a
    writable tmpfs in every container.
    """
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
