"""``report`` and ``top`` under ``scheduler: dra``: what the claims hold, and what does not add up.

Pods are admitted by the decision under a DRA policy, bound, and given the
claims kube-scheduler would allocate for them (tests/draclaims.py); each
case then changes one thing (what a claim consumes, a claim gone, a limit
gone) and names what the report says of it.
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.draclaims import allocate, resource_slice
from tests.helpers import apply, container, pod
from webhook.cli import build_parser
from webhook.cli.report import cmd_report
from webhook.decision.plan import plan
from webhook.decision.policy import DEFAULT_POLICY, Policy, parse_policy
from webhook.decision.prepared import Prepared
from webhook.errors import InputError
from webhook.report.claims import read_claims
from webhook.report.findings import Report, build_report
from webhook.report.objects import sort_objects
from webhook.report.render import as_json, as_table
from webhook.report.top import as_json as top_json
from webhook.report.top import as_table as top_table
from webhook.report.top import build_top

NOW = datetime(2026, 12, 4, 18, 0, tzinfo=UTC)
DRA = parse_policy({"scheduler": "dra"})
GIB = 2**30
MAPPING = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.example.com"},
    "spec": {"extendedResourceName": "aliyun.com/gpu-mem"},
}


def _listed(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", **obj}


def admitted(name: str, *containers: dict[str, Any], policy: Policy = DRA) -> dict[str, Any]:
    """A pod as admission under ``policy`` stores it, bound to node gpu-a."""
    obj = pod(*containers, name=name)
    decision = plan(obj, Prepared(policy), namespace="team-a")
    stored: dict[str, Any] = _listed(apply(obj, list(decision.patch)))
    stored["spec"]["nodeName"] = "gpu-a"
    stored["metadata"]["uid"] = f"uid-{name}"
    stored["status"] = {"phase": "Running"}
    return stored


def scene(change: Callable[[dict[str, Any], list[dict[str, Any]]], None]) -> list[Any]:
    """One 4 GiB pod and its allocated claim, changed by ``change``, with its node's slice."""
    stored = admitted("infer", container("main", gpu="4"))
    claims = allocate(stored, DRA)
    change(stored, claims)
    return [stored, *claims, resource_slice("gpu-a", 2)]


def report(items: list[Any], policy: Policy = DRA) -> Report:
    return build_report(sort_objects(items, "test"), policy, now=NOW)


def _rounded(_: dict[str, Any], claims: list[dict[str, Any]]) -> None:
    results = claims[0]["status"]["allocation"]["devices"]["results"]
    results[0]["consumedCapacity"]["memory"] = "5Gi"


def _not_allocated(_: dict[str, Any], claims: list[dict[str, Any]]) -> None:
    del claims[0]["status"]["allocation"]


def _never_made(stored: dict[str, Any], _: list[dict[str, Any]]) -> None:
    stored["status"]["resourceClaimStatuses"] = []


def _gone(_: dict[str, Any], claims: list[dict[str, Any]]) -> None:
    claims[0]["metadata"]["name"] = "someone-elses"


def _no_limit(stored: dict[str, Any], _: list[dict[str, Any]]) -> None:
    main = stored["spec"]["containers"][0]
    main["env"] = [e for e in main["env"] if e["name"] != "CUDA_DEVICE_MEMORY_LIMIT"]


def _as_is(*_: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("change", "status", "finding"),
    [
        (_as_is, "confined", None),
        (
            _rounded,
            "confined",
            "container 'main': CUDA_DEVICE_MEMORY_LIMIT is 4096 MiB, but its claim "
            "infer-gpushare-main-x7k2q holds 5120 MiB of gpu.nvidia.com/gpu-a/gpu-0: the shim "
            "and the scheduler disagree on what it may use",
        ),
        (_not_allocated, "confined", "its ResourceClaim infer-gpushare-main-x7k2q is not alloc"),
        (_never_made, "confined", "no ResourceClaim was made for it"),
        (_gone, "confined", "its ResourceClaim infer-gpushare-main-x7k2q is not there"),
        (_no_limit, "drifted", "container 'main': no CUDA_DEVICE_MEMORY_LIMIT: the shim does not"),
    ],
)
def test_what_a_claimed_pods_row_says(
    change: Callable[[dict[str, Any], list[dict[str, Any]]], None],
    status: str,
    finding: str | None,
) -> None:
    found = report(scene(change))
    (row,) = found.pods
    assert (row.status, row.held_per_pod) == (status, 4)
    if finding is None:
        assert row.findings == ()
        assert found.clean
    else:
        assert any(finding in f for f in row.findings), row.findings
    if change in (_not_allocated, _never_made, _gone):
        assert (row.devices, row.claimed_bytes, found.devices) == ((), None, ())


def test_each_device_with_its_shares_node_and_size() -> None:
    a = admitted("a", container("main", gpu="4"), container("side", gpu="2"))
    b = admitted("b", container("main", gpu="8"))
    claims = allocate(a, DRA) + allocate(b, DRA, first=1)  # b shares a's side's device
    found = report([a, b, *claims, resource_slice("gpu-a", 2)])
    assert [(d.node, d.id, d.total_bytes, d.held_bytes) for d in found.devices] == [
        ("gpu-a", "gpu.nvidia.com/gpu-a/gpu-0", 80 * GIB, 4 * GIB),
        ("gpu-a", "gpu.nvidia.com/gpu-a/gpu-1", 80 * GIB, 10 * GIB),
    ]
    assert [(h.pod, h.held_bytes) for h in found.devices[1].held] == [
        ("a", 2 * GIB),
        ("b", 8 * GIB),
    ]
    rows = {p.name: (p.held_per_pod, p.claimed_bytes, p.devices) for p in found.pods}
    assert rows == {
        "a": (6, 6 * GIB, ("gpu.nvidia.com/gpu-a/gpu-0", "gpu.nvidia.com/gpu-a/gpu-1")),
        "b": (8, 8 * GIB, ("gpu.nvidia.com/gpu-a/gpu-1",)),
    }
    device = as_json(found)["draDevices"][1]
    assert device["shares"][1] == {
        "namespace": "team-a", "name": "b", "claim": "b-gpushare-main-x7k2q",
        "shareID": "8c2f0b1e-0000-4000-8000-000000000001", "heldBytes": 8 * GIB,
        "usedBytes": None, "status": "confined",
    }  # fmt: skip
    table = as_table(found)
    assert "DRA GPUS (what the ResourceClaims hold)" in table
    assert "team-a/b (8192 MiB, confined)" in table
    assert "    its claims hold 6144 MiB on gpu.nvidia.com/gpu-a/gpu-0, " in table


def test_a_device_without_its_slice_is_placed_on_its_pods_node() -> None:
    stored = admitted("infer", container("main", gpu="4"))
    (device,) = report([stored, *allocate(stored, DRA)]).devices
    assert (device.node, device.total_bytes) == ("gpu-a", None)


def test_without_claims_in_the_input_the_dra_part_is_a_note() -> None:
    stored = admitted("infer", container("main", gpu="4"))
    found = report([stored])
    assert found.devices == ()
    assert found.pods[0].claimed_bytes is None
    assert any(n.startswith("no ResourceClaim in the input") for n in found.notes)


@pytest.mark.parametrize(
    ("policy", "finding"),
    [
        (DEFAULT_POLICY, "DeviceClass gpu.example.com maps aliyun.com/gpu-mem"),
        (parse_policy({"scheduler": "ack"}), "DeviceClass gpu.example.com maps aliyun.com/gpu-mem"),
        (DRA, None),  # the webhook takes the resource out of the pods it sets up
    ],
)
def test_a_device_class_mapping_the_policys_resource(policy: Policy, finding: str | None) -> None:
    found = report([MAPPING], policy)
    if finding is None:
        assert found.findings == ()
    else:
        (said,) = found.findings
        assert said.startswith(finding)
        assert "whole GPUs" in said
        assert not found.clean


def test_under_dra_the_gpu_pods_left_to_move_are_a_finding() -> None:
    left = admitted("old", container("main", gpu="4"), policy=DEFAULT_POLICY)
    moved = admitted("new", container("main", gpu="4"))
    found = report([left, moved, *allocate(moved, DRA)])
    assert found.findings == (
        "1 GPU pod still asks aliyun.com/gpu-mem without claims, placed by a scheduler other "
        "than DRA's (left to move to DRA): team-a/old",
    )
    old = next(p for p in found.pods if p.name == "old")
    assert old.status == "drifted"
    assert "not the ResourceClaims the policy gives: DRA holds none of its GPU memory" in (
        old.findings
    )
    assert report([left, moved], DEFAULT_POLICY).findings == ()


def test_report_from_a_file_reads_claims_and_slices(tmp_path: Path) -> None:
    items = scene(_as_is)
    listed = tmp_path / "cluster.json"
    listed.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    policy = tmp_path / "policy.yaml"
    policy.write_text("scheduler: dra\n")
    out = io.StringIO()
    args = build_parser().parse_args(
        ["report", "--from", str(listed), "--policy", str(policy), "-o", "json"]
    )
    assert cmd_report(args, io.StringIO(), out, io.StringIO(), clock=lambda: NOW) == 0
    found = json.loads(out.getvalue())
    (device,) = found["draDevices"]
    assert (device["node"], device["device"], device["totalBytes"]) == ("gpu-a", "gpu-0", 80 * GIB)
    assert found["pods"][0]["claimedBytes"] == 4 * GIB


def test_a_malformed_claim_is_one_line() -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "x"}}
    with pytest.raises(InputError, match=r"item 1 \(x\) has no metadata\.namespace"):
        sort_objects([claim], "test")


def test_top_gives_each_dra_device_a_row() -> None:
    a = admitted("a", container("main", gpu="4"))
    b = admitted("b", container("main", gpu="8"))
    claims = allocate(a, DRA) + allocate(b, DRA)
    b["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = "b-gpushare-main-x7k2q"
    claims[1]["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-0"
    held = read_claims([a, b], claims, [resource_slice("gpu-a", 1)], DRA)
    top = build_top([a, b], DRA, {"gpu-a": []}, held)
    assert [(p.pod, p.reserved_bytes, p.limit_bytes, p.devices) for p in top.pods] == [
        ("a", 4 * GIB, 4 * GIB, ("gpu.nvidia.com/gpu-a/gpu-0",)),
        ("b", 8 * GIB, 8 * GIB, ("gpu.nvidia.com/gpu-a/gpu-0",)),
    ]
    (gpu,) = top_json(top)["gpus"]
    assert gpu == {
        "node": "gpu-a", "gpu": None, "reservedBytes": 12 * GIB, "limitBytes": 12 * GIB,
        "usedBytes": 0, "pods": 2, "device": "gpu.nvidia.com/gpu-a/gpu-0",
    }  # fmt: skip
    assert "gpu.nvidia.com/gpu-a/gpu-0   team-a      a     4096Mi" in top_table(top)
    # without the claims (not read), a DRA pod is still a row: its limit, from its model
    (bare, _) = build_top([a, b], DRA, {"gpu-a": []}).pods
    assert (bare.reserved_bytes, bare.limit_bytes, bare.devices) == (None, 4 * GIB, ())


def test_a_finished_or_deleted_pods_claims_are_not_counted() -> None:
    stored = admitted("done", container("main", gpu="4"))
    claims = allocate(stored, DRA)
    ended = copy.deepcopy(stored)
    ended["status"]["phase"] = "Succeeded"
    assert read_claims([ended], claims, [], DRA).devices == ()
    stored["metadata"]["deletionTimestamp"] = "2026-12-04T17:59:00Z"
    assert read_claims([stored], claims, [], DRA).by_pod == {}
