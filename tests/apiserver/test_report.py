"""``gpushare-webhook report`` against the real API server: what it finds is what happened.

Pods are made the ways that leave a GPU pod set up or not: with the webhook
called (confined), in a namespace that opted out of it (drifted: the
webhook never saw them), in a namespace the policy only warns in (warned),
and with a request no policy admits (would be refused). They are bound to
Nodes whose GPU capacity is set through the status subresource, as the
scheduler and the kubelet would. The report runs as its own ServiceAccount,
with the RBAC of manifests/components/report, against the cluster, as a
kubectl plugin, and offline from what ``kubectl get -o json`` saved; all
three must agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.apiserver.helpers import (
    cli_json,
    create_namespace,
    create_pod,
    delete_namespaces,
    delete_nodes,
    gpu_container,
    pod_manifest,
    put_node,
    wait_for_service_account,
)
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.install import NS, ROOT, Installed, service_account_kubeconfig
from tests.helpers import eventually

CONFINED, DRIFT, WARN = "report-confined", "report-drift", "report-warn"
LISTED = "pods,deployments,statefulsets,daemonsets,jobs,cronjobs,replicasets,nodes"


def bind(plane: ControlPlane, namespace: str, name: str, node: str) -> None:
    """Place a pod on a node, as the scheduler does (nothing here schedules).

    Through kubectl: the API answers a Binding with a Status, which the
    Python client fails to read back as a Binding.
    """
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    plane.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(body))


def deployment(name: str, gpu: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [gpu_container(gpu=gpu)]},
            },
        },
    }


def make_scene(installed: Installed) -> None:
    """The pods, workloads and nodes the report is asked about."""
    api, plane = installed.api, installed.plane
    create_namespace(api, CONFINED)
    create_namespace(api, DRIFT, {"gpushare-webhook.io/injection": "disabled"})
    create_namespace(api, WARN)
    for namespace in (CONFINED, DRIFT, WARN):
        wait_for_service_account(api, namespace)
    put_node(api, "report-gpu-1", memory=80, count=2, labels={"gpushare": "true"})
    put_node(api, "report-gpu-2", memory=32, count=2, labels={"gpushare": "true"})
    create_pod(api, CONFINED, pod_manifest("confined", gpu_container(gpu="4")))
    bind(plane, CONFINED, "confined", "report-gpu-1")
    create_pod(api, DRIFT, pod_manifest("slipped-past", gpu_container(gpu="8")))
    bind(plane, DRIFT, "slipped-past", "report-gpu-1")
    create_pod(api, DRIFT, pod_manifest("bytes", gpu_container(gpu="4Gi")))
    privileged = gpu_container("sidecar", gpu=None, securityContext={"privileged": True})
    create_pod(api, WARN, pod_manifest("warned", gpu_container(gpu="4"), privileged))
    bind(plane, WARN, "warned", "report-gpu-2")
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(CONFINED, deployment("serving", "2"))
    apps.create_namespaced_deployment(CONFINED, deployment("bytes", "4Gi"))
    eventually(lambda: len(client.CoreV1Api(api).list_namespaced_pod(CONFINED).items) == 2, 30)
    plane.kubectl("get", "replicasets", "-n", CONFINED)  # made by the controller manager


@pytest.fixture(scope="module")
def scene(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The scene, made under a policy that warns in WARN; the report's RBAC installed.

    The policy changes in its ConfigMap and in the file the webhook serves
    from, as the kubelet would project it (the report reads the ConfigMap).
    """
    policy = installed.folder / "mounted" / "policy.yaml"
    before = policy.read_text()
    warn = {**(yaml.safe_load(before) or {}), "namespaces": {WARN: {"enforcement": "warn"}}}
    set_policy(installed, yaml.safe_dump(warn))
    folder = tmp_path_factory.mktemp("report")
    try:
        eventually(lambda: installed.server.metrics()["gpushare_policy_reloads_total"] >= 1)
        rendered = installed.plane.kubectl("kustomize", str(ROOT / "manifests/overlays/report"))
        report_rbac = [
            doc
            for doc in yaml.safe_load_all(rendered.stdout)
            if doc and "report" in doc["metadata"]["name"] and doc["kind"] != "CronJob"
        ]
        installed.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(report_rbac))
        make_scene(installed)
        (folder / "policy.yaml").write_text(policy.read_text())
        yield folder
    finally:
        set_policy(installed, before)
        delete_nodes(installed.api, seen_by=installed.server)
        delete_namespaces(installed.api, CONFINED, DRIFT, WARN)


def set_policy(installed: Installed, text: str) -> None:
    body = {"data": {"policy.yaml": text}}
    client.CoreV1Api(installed.api).patch_namespaced_config_map("gpushare-webhook-policy", NS, body)
    (installed.folder / "mounted" / "policy.yaml").write_text(text)


def report(*args: str, plugin: bool = False) -> tuple[int, dict[str, Any]]:
    return cli_json("report", "--output=json", *args, plugin=plugin)


def ours(found: dict[str, Any]) -> dict[str, Any]:
    """What the report says of this module's scene, and nothing of other tests' objects.

    A Deployment's pod is named by its Deployment ("serving-<hash>-<hash>": "serving").
    """
    return {
        "pods": {
            f"{p['namespace']}/{p['name'].split('-')[0]}": p["status"]
            for p in found["pods"]
            if p["namespace"].startswith("report-")
        },
        "workloads": {
            f"{w['kind']}/{w['name']}": w["status"]
            for w in found["workloads"]
            if w["namespace"].startswith("report-")
        },
        "nodes": {n["name"]: n for n in found["nodes"] if n["name"].startswith("report-")},
    }


EXPECTED_PODS = {
    f"{CONFINED}/confined": "confined",
    f"{CONFINED}/serving": "confined",  # the Deployment's pod, set up by the webhook
    f"{DRIFT}/slipped": "drifted",
    f"{DRIFT}/bytes": "would-be-refused",
    f"{WARN}/warned": "warned",
}
EXPECTED_WORKLOADS = {"Deployment/bytes": "would-be-refused", "Deployment/serving": "ok"}


def test_the_report_as_its_service_account_finds_what_happened(
    installed: Installed, scene: Path
) -> None:
    kubeconfig = service_account_kubeconfig(installed.plane, "gpushare-webhook-report", scene)
    code, found = report("--kubeconfig", str(kubeconfig))
    assert code == 1  # drift and refusals found
    mine = ours(found)
    assert mine["pods"] == EXPECTED_PODS
    assert mine["workloads"] == EXPECTED_WORKLOADS
    (drifted,) = [p for p in found["pods"] if p["namespace"] == DRIFT and p["status"] == "drifted"]
    assert any("no CUDA_DEVICE_MEMORY_LIMIT" in f for f in drifted["findings"])
    assert drifted["cause"].startswith("admitted without the webhook")
    assert drifted["withoutLimit"] is True
    gpu1, gpu2 = mine["nodes"]["report-gpu-1"], mine["nodes"]["report-gpu-2"]
    assert (gpu1["gpus"], gpu1["memoryPerGpu"], gpu1["total"]) == (2, 40, 80)
    # Bound by hand, not by the scheduler extender: nothing is reserved for them.
    assert (gpu1["used"], gpu1["free"], gpu1["pods"]) == (0, 80, 2)
    assert [(d["total"], d["used"], d["pods"]) for d in gpu1["devices"]] == [(40, 0, [])] * 2
    assert gpu1["unaccounted"] == [f"{CONFINED}/confined", f"{DRIFT}/slipped-past"]
    assert gpu1["withoutLimit"] == [f"{DRIFT}/slipped-past"]
    assert (gpu2["used"], gpu2["withoutLimit"], gpu2["unaccounted"]) == (0, [], [f"{WARN}/warned"])
    assert not any(note.startswith("the policy ConfigMap") for note in found["notes"])


def test_the_kubectl_plugin_and_a_saved_list_agree_with_the_cluster(
    installed: Installed, scene: Path
) -> None:
    kubeconfig = str(installed.plane.kubeconfig)
    code, live = report("--kubeconfig", kubeconfig, plugin=True)
    assert code == 1
    saved = scene / "cluster.json"
    listed = installed.plane.kubectl("get", LISTED, "-A", "-o", "json")
    saved.write_text(listed.stdout)
    code, offline = report("--from", str(saved), "--policy", str(scene / "policy.yaml"))
    assert code == 1
    assert ours(offline) == ours(live)
    assert ours(live)["pods"] == EXPECTED_PODS
    # One namespace: its pods and workloads only.
    code, narrowed = report("--kubeconfig", kubeconfig, "-n", WARN)
    assert {p["namespace"] for p in narrowed["pods"]} == {WARN}
    assert narrowed["workloads"] == []


def test_under_warn_kubectl_shows_each_refusal_and_the_pod_is_set_up(
    installed: Installed, scene: Path
) -> None:
    privileged = gpu_container("debug", gpu=None, securityContext={"privileged": True})
    manifest = pod_manifest("tried", gpu_container(gpu="48"), privileged)
    done = installed.plane.kubectl("apply", "-n", WARN, "-f", "-", stdin=json.dumps(manifest))
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning: ")]
    assert warnings == [
        "Warning: gpushare-webhook would refuse this pod: container 'debug' sets "
        "securityContext.privileged: true; a privileged container sees every GPU of the node, "
        "past the device cgroup and the GPU shim's limit, in a GPU-memory pod: remove privileged",
        "Warning: gpushare-webhook would refuse this pod: container 'main' asks 48 GiB of "
        "aliyun.com/gpu-mem per GPU, but the largest GPU has 40 GiB (1 node of the cluster's GPU "
        "nodes): the pod could never be scheduled; ask at most 40",
    ]
    stored = client.CoreV1Api(installed.api).read_namespaced_pod("tried", WARN).to_dict()
    env = {e["name"]: e.get("value") for e in stored["spec"]["containers"][0]["env"] or []}
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "49152m"  # set up all the same

    def audited() -> dict[str, str]:
        for line in installed.plane.audit_log.read_text().splitlines():
            event = json.loads(line)
            ref = event.get("objectRef", {})
            if ref.get("name") == "tried" and event.get("stage") == "ResponseComplete":
                found: dict[str, str] = event.get("annotations", {})
                return found
        return {}

    eventually(audited, timeout=15)
    found = audited()
    assert found["pods.gpushare-webhook.io/decision"] == "warned"
    assert found["pods.gpushare-webhook.io/reasons"] == "privileged,exceeds-gpu"
