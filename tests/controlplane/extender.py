"""The GPU Share Scheduler Extender, built from its upstream source for the scheduling tier.

No module proxy serves it as a program, so the tests take its source from
where ``GPUSHARE_EXTENDER_SOURCE`` points: a directory holding its source
tarball (``gpushare-scheduler-extender-*.tar.gz``, as ``../shared/counterparts``
does) or a checkout of the repository. It is built with the machine's Go
(its dependencies from the module proxy) into the cache of tests/gotools.py,
keyed by the source's bytes and the Go version; a tarball is unpacked into a
scratch folder of that cache, never into the work tree. Nothing of it is
copied into this repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests import gotools

VARIABLE = "GPUSHARE_EXTENDER_SOURCE"
MODULE = "github.com/AliyunContainerService/gpushare-scheduler-extender"
COMMIT = "c0b61411cddabd1b19500878ab355afeeae5589e"
NAME = "gpushare-sche-extender"
TARBALLS = "gpushare-scheduler-extender-*.tar.gz"
HINT = (
    f"set {VARIABLE} to a directory holding the extender's source tarball ({TARBALLS}) "
    f"or to a checkout of {MODULE} at commit {COMMIT[:7]}"
)

Unavailable = gotools.Unavailable


@dataclass(frozen=True)
class Source:
    path: Path  # the tarball, or the checkout's root
    tarball: bool


def _is_checkout(folder: Path) -> bool:
    go_mod = folder / "go.mod"
    if not go_mod.is_file():
        return False
    first = go_mod.read_text(errors="replace").split("\n", 1)[0].split()
    return first == ["module", MODULE]


def source() -> Source:
    """Where the extender's source is, from ``GPUSHARE_EXTENDER_SOURCE``."""
    named = os.environ.get(VARIABLE, "")
    if not named:
        raise Unavailable(f"{VARIABLE} is not set: {HINT}")
    folder = Path(named)
    if not folder.is_dir():
        raise Unavailable(f"{VARIABLE}={named} is not a directory: {HINT}")
    if _is_checkout(folder):
        return Source(folder, tarball=False)
    tarballs = sorted(folder.glob(TARBALLS))
    if tarballs:
        return Source(tarballs[-1], tarball=True)
    raise Unavailable(f"{VARIABLE}={named} holds neither {TARBALLS} nor {MODULE}: {HINT}")


def _key(go: str, found: Source) -> str:
    digest = hashlib.sha256()
    if found.tarball:
        digest.update(found.path.read_bytes())
    else:
        names = ["go.mod", "go.sum"]
        names += sorted(
            str(path.relative_to(found.path))
            for path in found.path.rglob("*.go")
            if ".git" not in path.relative_to(found.path).parts
        )
        for name in names:
            file = found.path / name
            digest.update(name.encode() + b"\0")
            digest.update(file.read_bytes() if file.is_file() else b"")
    digest.update(gotools.go_version(go).encode())
    return digest.hexdigest()[:16]


def _unpack(tarball: Path, scratch: Path) -> Path:
    """The module's root, unpacked from ``tarball`` into ``scratch``."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(scratch, filter="data")
    for go_mod in [*sorted(scratch.glob("*/go.mod")), scratch / "go.mod"]:
        if _is_checkout(go_mod.parent):
            return go_mod.parent
    raise Unavailable(f"{tarball.name} holds no go.mod of {MODULE}")


def ensure(*, say: bool = True) -> tuple[Path, float]:
    """The built extender and the seconds its build took (0 when the cache had it)."""
    go = gotools.find_go()
    found = source()
    cache = gotools.cache_base("GPUSHARE_GOTOOLS_CACHE", "gotools")
    folder = cache / f"{NAME}-{_key(go, found)}"

    def make() -> float:
        if not found.tarball:
            return gotools.go_build(go, found.path, {NAME: "./cmd"}, folder, ldflags="", say=say_it)
        scratch = folder.with_name(f"{folder.name}.src-{os.getpid()}")
        try:
            module = _unpack(found.path, scratch)
            return gotools.go_build(go, module, {NAME: "./cmd"}, folder, ldflags="", say=say_it)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    say_it = f"building the GPU share scheduler extender from {found.path}" if say else ""
    seconds = gotools.cached(folder, [NAME], make)
    if seconds and say:
        print(f"built the scheduler extender in {seconds:.0f} s", file=sys.stderr, flush=True)
    return folder / NAME, seconds


if __name__ == "__main__":
    try:
        print(ensure()[0])
    except Unavailable as error:
        sys.exit(f"scheduler extender: {error}")
