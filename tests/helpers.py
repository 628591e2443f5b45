"""Builders shared by the tests: pods, AdmissionReviews, patch application, ConfigMap swaps."""

from __future__ import annotations

import base64
import copy
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import jsonpatch
import pytest
import yaml

GPU = "aliyun.com/gpu-mem"

# Set by tests/mutation.py: the suite runs once per mutant, so properties draw
# fewer examples, always the same ones (tests/conftest.py's "mutation" profile).
MUTATION = bool(os.environ.get("GPUSHARE_MUTATION"))


def unavailable(what: str, why: object) -> NoReturn:
    """A counterpart the tests need cannot be had: a failure in CI (which has them), else a skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} unavailable in CI: {why}", pytrace=False)
    pytest.skip(f"{what} unavailable: {why}")


def examples(usual: int) -> int:
    """How many examples a property draws: a tenth under mutation testing."""
    return max(10, usual // 10) if MUTATION else usual


def container(name: str = "main", gpu: Any = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/pytorch:24.05-py3"}
    if gpu is not None:
        c["resources"] = {"limits": {GPU: gpu}}
    c.update(extra)
    return c


def pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    name: str = "train",
    namespace: str | None = "team-a",
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Pod of ``containers`` (one asking 4 GiB when none is given); ``spec`` adds fields.

    ``namespace=None`` leaves it out: a pod created in the namespace the request names.
    """
    body: dict[str, Any] = {"containers": list(containers) or [container(gpu="4")]}
    if init:
        body["initContainers"] = init
    body.update(spec)
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """A container's env as names and values (one set from elsewhere, valueFrom: empty)."""
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def review(
    obj: Any,
    *,
    uid: str = "7f0d2c4e-1b7a-4c55-9a8e-3f1f9d2b6a01",
    operation: str = "CREATE",
    namespace: str = "team-a",
    version: str = "v1",
    kind: str = "Pod",
    group: str = "",
) -> dict[str, Any]:
    return {
        "apiVersion": f"admission.k8s.io/{version}",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


def decode_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))  # type: ignore[no-any-return]


def apply(obj: Any, ops: list[dict[str, Any]]) -> Any:
    return jsonpatch.apply_patch(copy.deepcopy(obj), ops)


def swap(directory: Path, text: str, generation: int) -> None:
    """Update the file the way the kubelet updates a mounted ConfigMap: a symlink swap."""
    data = directory / f"..{generation}"
    data.mkdir()
    (data / "policy.yaml").write_text(text)
    link = directory / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, directory / "..data")
    target = directory / "policy.yaml"
    if not target.is_symlink():
        target.symlink_to("..data/policy.yaml")


def eventually(check: Callable[[], object], timeout: float = 15.0) -> None:
    """Wait until ``check()`` is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"not true within {timeout}s")


class _Dumper(yaml.SafeDumper):
    """Writes many-line text (a policy) as a block, and names what cases share (a node list)."""

    def generate_anchor(self, node: yaml.Node) -> str:
        self.last_anchor_id += 1
        return "shared" if self.last_anchor_id == 1 else f"shared{self.last_anchor_id}"


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def rewrite_case(path: Path, index: int, key: str, value: Any) -> None:
    """Set ``key`` of case ``index`` in a YAML list of cases (GOLDEN_UPDATE=1), keeping its
    leading comment."""
    text = path.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    cases = yaml.safe_load(text)
    cases[index][key] = value
    body = yaml.dump(
        cases,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        default_flow_style=None,
    )
    path.write_text(header + body)
