"""Files a serving process re-reads when they change: the policy and the certificate pair.

Both arrive the same way in a cluster: the kubelet projects a ConfigMap or a
Secret into a directory and updates it by swapping a symlink, so for a
moment the files may be missing, or (when someone edits them in place)
half-written. Both follow one rule, kept here once: look at the files at
most once per ``interval``; when their bytes change, load them; a load that
fails keeps the *last good* value in service and records why, and the same
broken bytes are not tried again until they change.

A change is seen by the files' contents, not their mtime: two writes within
one clock tick of the file system leave the mtime unchanged, and the files
are a few kilobytes, so hashing them once a second costs nothing. The node
snapshot is the exception (``replaced``): it can be megabytes, and its one
writer replaces it whole, by rename, at most every quarter second, so a new
inode and mtime say it changed without reading it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


def fingerprint(paths: Sequence[Path]) -> str:
    """A digest of the files' bytes (a missing or unreadable file counts as its error)."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            digest.update(path.read_bytes())
        except OSError as error:
            digest.update(f"\0unreadable: {error.strerror}\0".encode())
    return digest.hexdigest()


def replaced(paths: Sequence[Path]) -> str:
    """The files' identities (inode, mtime, size): for files only ever replaced by rename."""
    parts = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError as error:
            parts.append(f"unreadable: {error.strerror}")
        else:
            parts.append(f"{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_size}")
    return "|".join(parts)


class WatchedFiles(Generic[T]):
    """A value loaded from files, reloaded when their bytes change, the last good one kept.

    ``load`` reads the files itself and raises one of ``errors`` when they
    hold nothing usable; the first load's error propagates (a server must not
    start on a broken file), later ones are kept in ``error``.
    """

    def __init__(
        self,
        paths: Sequence[Path],
        load: Callable[[], T],
        *,
        errors: tuple[type[Exception], ...],
        interval: float = 1.0,
        on_error: Callable[[str], None] | None = None,
        changed: Callable[[Sequence[Path]], str] = fingerprint,
    ) -> None:
        self.paths, self.interval = tuple(paths), interval
        self._load, self._errors, self._on_error = load, errors, on_error
        self._changed = changed
        self._lock = threading.Lock()
        self._seen = changed(self.paths)
        self.value = load()
        self._checked = time.monotonic()
        self.error = ""
        self.reloads = 0
        self.failures = 0

    def get(self) -> T:
        if time.monotonic() - self._checked >= self.interval:
            self.refresh()
        return self.value

    def refresh(self) -> bool:
        """Look at the files now; True when a new value took effect."""
        with self._lock:
            self._checked = time.monotonic()
            seen = self._changed(self.paths)
            if seen == self._seen:
                return False
            self._seen = seen
            try:
                value = self._load()
            except self._errors as error:
                self.error = str(error)
                self.failures += 1
                if self._on_error is not None:
                    self._on_error(self.error)
                return False
            self.value, self.error = value, ""
            self.reloads += 1
            return True
