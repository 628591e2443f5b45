"""``report`` and ``top`` under ``scheduler: dra``, against the real API server.

Pods are stored as the webhook sets them up under a DRA policy (its patch,
applied here, in a namespace that opts out of the installed webhook, which
serves another policy), bound to a node; their claims are created through
the API and allocated as kube-scheduler allocates them, by writing each
claim's status through its status subresource, and each pod's
``status.resourceClaimStatuses`` through the pod's (no scheduler or
resourceclaim controller works for them here: their templates are never
made). The node's ResourceSlice is what a DRA driver publishes. The
report, as its ServiceAccount with the RBAC of manifests/components/report,
and ``top`` read them from the cluster; a saved list gives the report the
same answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apiserver.helpers import (
    cli_json,
    create_namespace,
    delete_namespaces,
    wait_for_service_account,
)
from tests.apiserver.test_report import bind
from tests.controlplane.install import NS as GPUSHARE_NS
from tests.controlplane.install import ROOT, Installed, service_account_kubeconfig
from tests.draclaims import allocate, resource_slice
from tests.helpers import container
from tests.test_report_dra import DRA, admitted

NS, NODE = "report-dra", "report-dra-gpu"
GIB = 2**30
LISTED = "pods,resourceclaims,resourceslices,deviceclasses"


def _store(installed: Installed, stored: dict[str, Any], claims: list[dict[str, Any]]) -> None:
    """The pod and its claims through the API, each status through its subresource."""
    plane = installed.plane
    name = stored["metadata"]["name"]
    body = {k: v for k, v in stored.items() if k != "status"}
    body["metadata"] = {**body["metadata"], "namespace": NS}
    body["spec"] = {k: v for k, v in body["spec"].items() if k != "nodeName"}
    created = json.loads(plane.kubectl("create", "-n", NS, "-o", "json", "-f", "-",
                                       stdin=json.dumps(body)).stdout)  # fmt: skip
    bind(plane, NS, name, NODE)
    for claim in claims:
        status = claim["status"]
        spec = {k: v for k, v in claim.items() if k != "status"}
        plane.kubectl("create", "-n", NS, "-f", "-", stdin=json.dumps(spec))
        status["reservedFor"][0]["uid"] = created["metadata"]["uid"]
        plane.kubectl(
            "patch", "resourceclaim", claim["metadata"]["name"], "-n", NS,
            "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}),
        )  # fmt: skip
    statuses = {"status": {"resourceClaimStatuses": stored["status"]["resourceClaimStatuses"]}}
    plane.kubectl(
        "patch", "pod", name, "-n", NS, "--subresource=status", "--type=merge",
        "-p", json.dumps(statuses),
    )  # fmt: skip


def _pod(name: str, gib: str, *, consumed: str = "", first: int = 0) -> tuple[Any, list[Any]]:
    stored = admitted(name, container("main", gpu=gib))
    stored["metadata"]["namespace"] = NS
    held = {"gpushare-main": consumed} if consumed else None
    claims = allocate(stored, DRA, pool=NODE, held=held, first=first)
    return stored, claims


@pytest.fixture(scope="module")
def scene(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    api, plane = installed.api, installed.plane
    folder = tmp_path_factory.mktemp("report-dra")
    (folder / "policy.yaml").write_text("scheduler: dra\n")
    rendered = plane.kubectl("kustomize", str(ROOT / "manifests/overlays/report"))
    rbac = [
        doc
        for doc in yaml.safe_load_all(rendered.stdout)
        if doc and "report" in doc["metadata"]["name"] and doc["kind"] != "CronJob"
    ]
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    create_namespace(api, NS, {"gpushare-webhook.io/injection": "disabled"})
    try:
        wait_for_service_account(api, NS)
        plane.kubectl("create", "-f", "-", stdin=json.dumps(resource_slice(NODE, 2)))
        plane.kubectl("create", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}))  # fmt: skip
        _store(installed, *_pod("infer", "4"))
        _store(installed, *_pod("rounded", "3", consumed="4Gi", first=1))
        yield folder
    finally:
        delete_namespaces(api, NS)
        plane.kubectl("delete", "resourceslice", f"{NODE}-gpu.nvidia.com", check=False)
        plane.kubectl("delete", "node", NODE, check=False)


def _run(command: str, *args: str) -> tuple[int, dict[str, Any]]:
    return cli_json(command, "--output=json", *args)


def _ours(found: dict[str, Any]) -> dict[str, Any]:
    return {
        "pods": {
            p["name"]: (p["status"], p["gpuMemory"], p["claimedBytes"], p["draDevices"])
            for p in found["pods"]
            if p["namespace"] == NS
        },
        "devices": [
            (
                d["node"],
                d["device"],
                d["totalBytes"],
                d["heldBytes"],
                [(s["name"], s["heldBytes"]) for s in d["shares"]],
            )
            for d in found["draDevices"]
            if d["node"] == NODE
        ],
    }


EXPECTED = {
    "pods": {
        "infer": ("confined", 4, 4 * GIB, [f"gpu.nvidia.com/{NODE}/gpu-0"]),
        "rounded": ("confined", 3, 4 * GIB, [f"gpu.nvidia.com/{NODE}/gpu-1"]),
    },
    "devices": [
        (NODE, "gpu-0", 80 * GIB, 4 * GIB, [("infer", 4 * GIB)]),
        (NODE, "gpu-1", 80 * GIB, 4 * GIB, [("rounded", 4 * GIB)]),
    ],
}


def test_the_report_reads_what_the_claims_hold(installed: Installed, scene: Path) -> None:
    kubeconfig = service_account_kubeconfig(installed.plane, "gpushare-webhook-report", scene)
    policy = str(scene / "policy.yaml")
    _, live = _run("report", "--kubeconfig", str(kubeconfig), "--policy", policy)
    assert _ours(live) == EXPECTED
    assert not [n for n in live["notes"] if "could not be read" in n]
    (rounded,) = [p for p in live["pods"] if p["name"] == "rounded" and p["namespace"] == NS]
    assert rounded["findings"] == [
        "container 'main': CUDA_DEVICE_MEMORY_LIMIT is 3072 MiB, but its claim "
        f"rounded-gpushare-main-x7k2q holds 4096 MiB of gpu.nvidia.com/{NODE}/gpu-1: the shim "
        "and the scheduler disagree on what it may use"
    ]
    saved = scene / "cluster.json"
    saved.write_text(installed.plane.kubectl("get", LISTED, "-A", "-o", "json").stdout)
    _, offline = _run("report", "--from", str(saved), "--policy", policy)
    assert _ours(offline) == EXPECTED


def test_top_gives_each_claimed_device_a_row(installed: Installed, scene: Path) -> None:
    args = ["--kubeconfig", str(installed.plane.kubeconfig), "--policy", str(scene / "policy.yaml")]
    _, found = _run("top", "-n", NS, *args)
    rows = {p["pod"]: (p["reservedBytes"], p["limitBytes"], p["devices"]) for p in found["pods"]}
    assert rows == {
        "infer": (4 * GIB, 4 * GIB, [f"gpu.nvidia.com/{NODE}/gpu-0"]),
        "rounded": (4 * GIB, 3 * GIB, [f"gpu.nvidia.com/{NODE}/gpu-1"]),
    }
    assert [(g["device"], g["reservedBytes"], g["pods"]) for g in found["gpus"]] == [
        (f"gpu.nvidia.com/{NODE}/gpu-0", 4 * GIB, 1),
        (f"gpu.nvidia.com/{NODE}/gpu-1", 4 * GIB, 1),
    ]


def test_a_report_forbidden_the_dra_objects_says_so_and_goes_on(
    installed: Installed, scene: Path
) -> None:
    """The report's RBAC less resource.k8s.io: one note per list, the rest of the report."""
    name = "report-dra-narrow"
    rendered = installed.plane.kubectl("kustomize", str(ROOT / "manifests/overlays/report"))
    role = next(
        doc
        for doc in yaml.safe_load_all(rendered.stdout)
        if doc and doc["kind"] == "ClusterRole" and doc["metadata"]["name"].endswith("report")
    )
    rules = [r for r in role["rules"] if "resource.k8s.io" not in r["apiGroups"]]
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": GPUSHARE_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": GPUSHARE_NS}]},
    ]  # fmt: skip
    installed.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    try:
        kubeconfig = service_account_kubeconfig(installed.plane, name, scene)
        args = ["--kubeconfig", str(kubeconfig), "--policy", str(scene / "policy.yaml")]
        _, found = _run("report", *args)
        notes = [n for n in found["notes"] if "could not be read (forbidden)" in n]
        assert [n.split(" could")[0] for n in notes] == [
            "DeviceClasses",
            "ResourceClaims",
            "ResourceSlices",
        ]
        assert found["draDevices"] == []
        assert {p["name"]: p["status"] for p in found["pods"] if p["namespace"] == NS} == {
            "infer": "confined",
            "rounded": "confined",
        }
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            installed.plane.kubectl("delete", kind, name, check=False)
        installed.plane.kubectl("delete", "serviceaccount", name, "-n", GPUSHARE_NS, check=False)
