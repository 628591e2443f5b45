"""Build the real control plane once: kube-apiserver, kube-controller-manager, etcd.

The Go module beside this file pins them (k8s.io/kubernetes and its staging
modules at one release, etcd's server module at the release Kubernetes
pins for its client). They are built with the machine's Go into a cache
outside the work tree, keyed by what decides the bytes of the binaries
(go.mod, go.sum, etcd/main.go, the link flags, the Go version), so a second
run costs one hash. Concurrent runs wait for one build on a file lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MODULE = Path(__file__).resolve().parent
KUBERNETES = "v1.37.2"
COMMANDS = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "etcd": "./etcd",
}
# The version the binaries report (kubectl and the client compare it with
# their own); a build outside Kubernetes' tree would otherwise say v0.0.0.
LDFLAGS = " ".join(
    [
        "-s -w",
        f"-X k8s.io/component-base/version.gitVersion={KUBERNETES}",
        "-X k8s.io/component-base/version.gitMajor=1",
        f"-X k8s.io/component-base/version.gitMinor={KUBERNETES.split('.')[1]}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
    ]
)


class Unavailable(Exception):
    """The binaries cannot be had here; the message is one line saying why."""


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_controller_manager: Path
    etcd: Path
    build_seconds: float  # of the build that filled the cache; 0 when it was there


def cache_root() -> Path:
    override = os.environ.get("GPUSHARE_CONTROLPLANE_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpushare-webhook" / "controlplane"


def find_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise Unavailable("Go is not installed: the real control plane is built from its Go module")
    return go


def _key(go: str) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "etcd/main.go"):
        digest.update((MODULE / name).read_bytes())
    digest.update(LDFLAGS.encode())
    version = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, check=True
    ).stdout.strip()
    digest.update(version.encode())
    return f"{KUBERNETES}-{digest.hexdigest()[:16]}"


def _binaries(folder: Path, seconds: float) -> Binaries:
    return Binaries(
        kube_apiserver=folder / "kube-apiserver",
        kube_controller_manager=folder / "kube-controller-manager",
        etcd=folder / "etcd",
        build_seconds=seconds,
    )


def ensure(*, say: bool = True) -> Binaries:
    """The built binaries, building them first if the cache lacks them."""
    go = find_go()
    root = cache_root()
    folder = root / _key(go)
    if all((folder / name).is_file() for name in COMMANDS):
        return _binaries(folder, 0.0)
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building the same key
        if all((folder / name).is_file() for name in COMMANDS):
            return _binaries(folder, 0.0)
        return _build(go, folder, say=say)


def _build(go: str, folder: Path, *, say: bool) -> Binaries:
    scratch = folder.with_name(folder.name + f".partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    if say:
        print(
            f"building kube-apiserver, kube-controller-manager and etcd ({KUBERNETES}) "
            f"into {folder}: the first time only, about 10 minutes on 2 cores",
            file=sys.stderr,
            flush=True,
        )
    env = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    env.setdefault("GOTOOLCHAIN", "local")
    started = time.monotonic()
    log = scratch / "build.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [
                go,
                "build",
                "-trimpath",
                "-ldflags",
                LDFLAGS,
                "-o",
                f"{scratch}/",
                *COMMANDS.values(),
            ],
            cwd=MODULE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise Unavailable(f"go build of the control plane failed ({log}): {tail[0]}")
    (scratch / "build.json").write_text(
        json.dumps({"kubernetes": KUBERNETES, "seconds": round(seconds, 1)}) + "\n"
    )
    shutil.rmtree(folder, ignore_errors=True)
    scratch.rename(folder)
    if say:
        print(f"built the control plane in {seconds:.0f} s", file=sys.stderr, flush=True)
    return _binaries(folder, seconds)


if __name__ == "__main__":
    try:
        built = ensure()
    except Unavailable as error:
        sys.exit(f"control plane: {error}")
    print(built.kube_apiserver.parent)
