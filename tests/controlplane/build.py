"""Build the real control plane once: kube-apiserver, kube-controller-manager, kube-scheduler, etcd.

The Go module beside this file pins them (k8s.io/kubernetes and its staging
modules at one release, etcd's server module at the release Kubernetes
pins for its client). tests/gotools.py builds them with the machine's Go
into a cache outside the work tree, keyed by what decides the bytes of the
binaries (go.mod, go.sum, etcd/main.go, the link flags, the Go version).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tests import gotools

MODULE = Path(__file__).resolve().parent
KUBERNETES = "v1.37.2"
COMMANDS = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
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


Unavailable = gotools.Unavailable
find_go = gotools.find_go


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    etcd: Path
    build_seconds: float  # of the build that filled the cache; 0 when it was there


def cache_root() -> Path:
    return gotools.cache_base("GPUSHARE_CONTROLPLANE_CACHE", "controlplane")


def ensure(*, say: bool = True) -> Binaries:
    """The built binaries, building them first if the cache lacks them."""
    folder, seconds = gotools.build(
        MODULE,
        COMMANDS,
        cache=cache_root(),
        label=KUBERNETES,
        ldflags=LDFLAGS,
        files=("go.mod", "go.sum", "etcd/main.go"),
        say=(
            f"building kube-apiserver, kube-controller-manager, kube-scheduler and etcd "
            f"({KUBERNETES}): the first time only, about 10 minutes on 2 cores"
            if say
            else ""
        ),
    )
    if seconds and say:
        print(f"built the control plane in {seconds:.0f} s", file=sys.stderr, flush=True)
    return Binaries(
        kube_apiserver=folder / "kube-apiserver",
        kube_controller_manager=folder / "kube-controller-manager",
        kube_scheduler=folder / "kube-scheduler",
        etcd=folder / "etcd",
        build_seconds=seconds,
    )


if __name__ == "__main__":
    try:
        built = ensure()
    except Unavailable as error:
        sys.exit(f"control plane: {error}")
    print(built.kube_apiserver.parent)
