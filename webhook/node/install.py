"""Delivering the shim to a node: copied beside its place, checked, then renamed over it.

Owns the check that a file is a shared library this node can load (its ELF
header: magic, class, ``ET_DYN``, the machine) and the atomic install: the
new bytes go to a temporary file in the target directory, are checked
again (header and sha256 against the source) and synced, and only then
renamed into place. A library is never rewritten where it stands: every
running container that preloads it has it mapped, and writing into a
mapped file changes the code under them (a crash at best). A rename gives
the path a new inode; the old one lives on, unchanged, until the last
process mapping it exits. A copy whose sha256 already equals the source's
is left alone, so re-running is free and touches nothing.
"""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from webhook.errors import ShimError

ELF_MAGIC = b"\x7fELF"
HEADER_SIZE = 20  # e_ident (16), e_type (2), e_machine (2)
ET_DYN = 3  # a shared object (or a position-independent executable)
# e_machine of the architectures GPU nodes run, and their ELF class (2: 64-bit).
MACHINES: dict[str, tuple[int, str]] = {
    "x86_64": (62, "x86-64"),
    "amd64": (62, "x86-64"),
    "aarch64": (183, "AArch64"),
    "arm64": (183, "AArch64"),
    "ppc64le": (21, "PowerPC64"),
}
ELFCLASS64 = 2
SHORT = 12  # hex digits of the sha256 in the node's label: enough to tell builds apart
CHUNK = 1 << 20

Outcome = Literal["installed", "current"]


@dataclass(frozen=True)
class Installed:
    """What one install did: the path, its sha256, and whether it was written or already there."""

    path: Path
    sha256: str
    outcome: Outcome

    @property
    def short(self) -> str:
        return self.sha256[:SHORT]


def machine_of(name: str | None = None) -> tuple[int, str]:
    """The ELF machine of this node (``platform.machine()``), or ShimError for an unknown one."""
    name = name or platform.machine()
    found = MACHINES.get(name.lower())
    if found is None:
        raise ShimError(f"this node's architecture {name!r} is not one the shim is built for")
    return found


def check_elf(header: bytes, what: str, machine: tuple[int, str]) -> None:
    """ShimError unless ``header`` starts a 64-bit ELF shared object for ``machine``."""
    if len(header) < HEADER_SIZE or header[:4] != ELF_MAGIC:
        raise ShimError(f"{what} is not an ELF shared library (no ELF header)")
    if header[4] != ELFCLASS64:
        raise ShimError(f"{what} is a 32-bit ELF file; the node needs a 64-bit shared library")
    order: Literal["little", "big"] = "little" if header[5] == 1 else "big"
    kind = int.from_bytes(header[16:18], order)
    if kind != ET_DYN:
        raise ShimError(f"{what} is an ELF file of type {kind}, not a shared library (3)")
    number, name = machine
    found = int.from_bytes(header[18:20], order)
    if found != number:
        raise ShimError(
            f"{what} is built for ELF machine {found}, but this node is {name} ({number}); "
            "use the image built for this node's architecture"
        )


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def _read_header(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(HEADER_SIZE)
    except FileNotFoundError:
        raise ShimError(f"{what} does not exist") from None
    except IsADirectoryError:
        raise ShimError(f"{what} is a directory, not a library") from None
    except OSError as error:
        raise ShimError(f"cannot read {what}: {error.strerror}") from None


def checked_source(source: Path, machine: tuple[int, str]) -> str:
    """The sha256 of the library to install, once its header says this node can load it."""
    what = f"the shim library {source}"
    check_elf(_read_header(source, what), what, machine)
    return digest(source)


def current(target: Path, sha256: str) -> bool:
    """Whether ``target`` is already the library with this sha256."""
    try:
        return target.is_file() and digest(target) == sha256
    except OSError:
        return False


def install_library(
    source: Path, target_dir: Path, name: str, *, machine: tuple[int, str] | None = None
) -> Installed:
    """Put ``source`` at ``target_dir/name``, unless the same bytes are there already."""
    machine = machine or machine_of()
    sha256 = checked_source(source, machine)
    target = target_dir / name
    if current(target, sha256):
        return Installed(target, sha256, "current")
    data = source.read_bytes()

    def verify(temp: Path) -> None:
        what = f"the copy {temp}"
        check_elf(_read_header(temp, what), what, machine)
        if digest(temp) != sha256:
            raise ShimError(f"{what} differs from {source} after writing: the disk or the source")

    write_atomically(target, data, verify, mode=0o755)
    return Installed(target, sha256, "installed")


def install_text(target: Path, text: str) -> Outcome:
    """Put a small text file (``ld.so.preload``) in place the same way; "current" if it is."""
    data = text.encode()
    try:
        if target.read_bytes() == data:
            return "current"
    except OSError:
        pass

    def verify(temp: Path) -> None:
        if temp.read_bytes() != data:
            raise ShimError(f"the copy {temp} differs from what was written")

    write_atomically(target, data, verify, mode=0o644)
    return "installed"


def write_atomically(
    target: Path, data: bytes, verify: Callable[[Path], None], *, mode: int
) -> None:
    """Write ``data`` to a new file beside ``target``, verify, sync, and rename it over ``target``.

    The temporary file is removed on any failure, so a node never holds a
    half-written library under the name pods preload.
    """
    directory = target.parent
    if not directory.is_dir():
        raise ShimError(
            f"{directory} is not a directory: mount the node's shim directory there "
            "(the DaemonSet's hostPath volume)"
        )
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".new", dir=directory)
    except OSError as error:
        raise ShimError(f"cannot write in {directory}: {error.strerror}") from None
    temp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, mode)
        verify(temp)
        os.replace(temp, target)
        _sync_directory(directory)
    except OSError as error:
        temp.unlink(missing_ok=True)
        raise ShimError(f"cannot install {target}: {error.strerror}") from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable: a crash after it must not bring the old name back."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
