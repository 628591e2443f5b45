"""Go programs the tests run (the control plane, helm, promtool, kwok), built once by the test run.

Each comes from a Go module in the repository that pins it (``go.mod`` and
``go.sum``: tests/controlplane, tests/gotools/helm, tests/gotools/promtool,
tests/gotools/kwok; the scheduler extender from its own source, see
tests/controlplane/extender.py) and is built with the machine's Go, through
the module proxy, into a cache outside the work tree
(``~/.cache/gpushare-webhook/<what>/<key>``; ``GPUSHARE_CONTROLPLANE_CACHE``
and ``GPUSHARE_GOTOOLS_CACHE`` move it), keyed by what decides the bytes of
the binaries: the module's files, the link flags and the Go version. A
second run costs one hash; concurrent runs wait on a file lock for one
build; a build cut short is never taken for a whole one (it is made in a
scratch folder, renamed when done).
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (module folder, package): each built from its own pinned module, so
# their dependencies (both need client-go, at other versions) never meet.
TOOLS = {
    "helm": (HERE / "gotools" / "helm", "helm.sh/helm/v4/cmd/helm"),
    "helm3": (HERE / "gotools" / "helm3", "helm.sh/helm/v3/cmd/helm"),
    "promtool": (HERE / "gotools" / "promtool", "github.com/prometheus/prometheus/cmd/promtool"),
    "kwok": (HERE / "gotools" / "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
}
# As Helm 3's own Makefile builds it: the Kubernetes version it renders for
# without a cluster is its client-go's (else 1.20, older than the chart allows).
LDFLAGS = {
    "helm3": " ".join(
        f"-X helm.sh/helm/v3/pkg/{package}.k8sVersion{part}={value}"
        for package in ("lint/rules", "chartutil")
        for part, value in (("Major", "1"), ("Minor", "36"))
    ),
}


class Unavailable(Exception):
    """A program cannot be had here; the message is one line saying why."""


def find_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise Unavailable("Go is not installed: the tests build their Go programs with it")
    return go


def cache_base(variable: str, what: str) -> Path:
    override = os.environ.get(variable)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpushare-webhook" / what


def go_version(go: str) -> str:
    return subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _key(go: str, module: Path, files: Sequence[str], ldflags: str) -> str:
    digest = hashlib.sha256()
    for name in files:
        digest.update((module / name).read_bytes())
    digest.update(ldflags.encode())
    digest.update(go_version(go).encode())
    return digest.hexdigest()[:16]


def cached(folder: Path, names: Iterable[str], make: Callable[[], float]) -> float:
    """0 when ``folder`` holds ``names``, else the seconds ``make()`` took to build them.

    ``make`` runs under the cache's file lock: another run may be building the same key.
    """
    names = list(names)
    if all((folder / name).is_file() for name in names):
        return 0.0
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((folder / name).is_file() for name in names):
            return 0.0
        return make()


def build(
    module: Path,
    commands: Mapping[str, str],
    *,
    cache: Path,
    label: str,
    ldflags: str = "",
    files: Sequence[str] = ("go.mod", "go.sum"),
    say: str = "",
) -> tuple[Path, float]:
    """The folder holding ``commands`` (name -> package) built from ``module``, and build seconds.

    The seconds are 0 when the cache had them. ``say`` is printed before a
    build (how long it takes), so a first run does not look stuck.
    """
    go = find_go()
    folder = cache / f"{label}-{_key(go, module, files, ldflags)}"
    seconds = cached(
        folder, commands, lambda: go_build(go, module, commands, folder, ldflags=ldflags, say=say)
    )
    return folder, seconds


def go_build(
    go: str, module: Path, commands: Mapping[str, str], folder: Path, *, ldflags: str, say: str
) -> float:
    """``go build`` of ``commands`` in ``module`` into ``folder`` (whole or not at all); seconds."""
    scratch = folder.with_name(folder.name + f".partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    if say:
        print(f"{say} into {folder}", file=sys.stderr, flush=True)
    env = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    env.setdefault("GOTOOLCHAIN", "local")
    started = time.monotonic()
    log = scratch / "build.log"
    flags = ["-ldflags", ldflags] if ldflags else []
    with log.open("wb") as out:
        done = subprocess.run(
            [go, "build", "-trimpath", *flags, "-o", f"{scratch}/", *commands.values()],
            cwd=module,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise Unavailable(f"go build in {module.name} failed ({log}): {tail[0]}")
    for name, package in commands.items():
        built = scratch / package.rstrip("/").rsplit("/", 1)[-1]
        if built.name != name and built.exists():
            built.rename(scratch / name)
    (scratch / "build.json").write_text(json.dumps({"seconds": round(seconds, 1)}) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    scratch.rename(folder)
    return seconds


def tool(name: str) -> Path:
    """The path of Go program ``name`` of TOOLS, building it the first time."""
    module, package = TOOLS[name]
    folder, _ = build(
        module,
        {name: package},
        cache=cache_base("GPUSHARE_GOTOOLS_CACHE", "gotools"),
        label=name,
        ldflags=LDFLAGS.get(name, ""),
        say=f"building {name} from its Go module (the first time only, a few minutes)",
    )
    return folder / name


# The CRDs a chart's custom objects are checked against, from the modules that ship them.
CRDS = HERE / "gotools" / "crds"
CRD_FILES = {
    "github.com/cert-manager/cert-manager": [
        f"deploy/crds/cert-manager.io_{plural}.yaml"
        for plural in ("issuers", "clusterissuers", "certificates", "certificaterequests")
    ],
    "github.com/prometheus-operator/prometheus-operator": [
        f"example/prometheus-operator-crd/monitoring.coreos.com_{plural}.yaml"
        for plural in ("servicemonitors", "podmonitors", "prometheusrules")
    ],
}


def crd_files() -> list[Path]:
    """The CRD files of CRD_FILES, downloaded through the module proxy (go.sum checks them)."""
    return module_files(CRDS, CRD_FILES)


def module_files(module: Path, files: Mapping[str, Sequence[str]]) -> list[Path]:
    """Files (module path -> names in it) of modules that ``module``'s go.mod pins, downloaded
    through the module proxy into Go's module cache (go.sum checks them)."""
    env = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=readonly"}
    env.setdefault("GOTOOLCHAIN", "local")
    done = subprocess.run(
        [find_go(), "mod", "download", "-json", *files],
        cwd=module,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
        raise Unavailable(f"cannot download {', '.join(files)}: {last[0]}")
    folders = {}
    decoder, text = json.JSONDecoder(), done.stdout.strip()
    while text:
        found, end = decoder.raw_decode(text)
        folders[found["Path"]] = Path(found["Dir"])
        text = text[end:].strip()
    return [folders[path] / name for path, names in files.items() for name in names]


if __name__ == "__main__":
    for wanted in sys.argv[1:] or TOOLS:
        try:
            print(tool(wanted))
        except Unavailable as error:
            sys.exit(f"{wanted}: {error}")
