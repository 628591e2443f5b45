"""Pods as each release of the webhook sets them up, kept so later guards are held to them.

``tests/skew/<version>/<policy>/<case>.yaml`` is a GPU pod as release
``<version>`` stores it under policy ``<version>/<policy>.policy.yaml``,
and ``<version>/<policy>.guard.yaml`` the guard that release makes from
that policy. A release adds its own folder (``python -m tests.skew``) and
never edits an earlier one. tests/apiserver/test_skew.py holds both
directions of the skew rule (docs/operations.md, "Version skew") through
the real API server: every kept pod passes the guard this code makes, and
the pods this code sets up pass every kept guard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.helpers import container, pod

HERE = Path(__file__).parent
NAMESPACE = "skew"

# The mix a release's set-up is kept for: what each container asks.
CASES: dict[str, dict[str, Any]] = {
    "single-gpu": pod(container(gpu="4"), name="single-gpu", namespace=NAMESPACE),
    "multi-gpu": pod(
        container(gpu="8"),
        name="multi-gpu",
        namespace=NAMESPACE,
        labels={"aliyun.com/gpu-count": "2"},  # as ACK reads the count
    ),
    "compute-share": pod(
        container(
            resources={
                "limits": {"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "30"}
            }
        ),
        name="compute-share",
        namespace=NAMESPACE,
    ),
    "init-container": pod(
        container(gpu="4"),
        init=[container("fetch", gpu="2")],
        name="init-container",
        namespace=NAMESPACE,
    ),
    "gpu-and-sidecar": pod(
        container(gpu="4"), container("sidecar"), name="gpu-and-sidecar", namespace=NAMESPACE
    ),
}

SHIPPED = HERE.parent.parent / "manifests" / "base" / "policy.yaml"
# The policies, as changes to the shipped one, and the cases kept under each
# (several GPUs per pod only where ACK's scheduler places pods).
POLICIES: dict[str, tuple[tuple[str, str], list[str]]] = {
    "shipped": (("", ""), ["single-gpu", "compute-share", "init-container", "gpu-and-sidecar"]),
    "ld-so-preload": (("ldSoPreload: false", "ldSoPreload: true"), ["single-gpu", "compute-share"]),
    "ack": (("scheduler: gpushare-extender", "scheduler: ack"), ["single-gpu", "multi-gpu"]),
}


def policies() -> dict[str, tuple[str, list[str]]]:
    """Each policy's text and its cases."""
    shipped: str = yaml.safe_load(SHIPPED.read_text())["data"]["policy.yaml"]
    made = {}
    for name, ((old, new), cases) in POLICIES.items():
        text = shipped.replace(old, new) if old else shipped
        assert not old or text != shipped, f"the shipped policy has no {old!r}"
        made[name] = (text, cases)
    return made


def guards(release: str = "*") -> list[Path]:
    """Every kept guard (of ``release``)."""
    return sorted(HERE.glob(f"{release}/*.guard.yaml"))


def kept(release: str = "*") -> list[tuple[str, str, Path]]:
    """Every kept pod (of ``release``): (release, policy name, file)."""
    return [
        (path.parts[-3], path.parent.name, path)
        for path in sorted(HERE.glob(f"{release}/*/*.yaml"))
    ]
