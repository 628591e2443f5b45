"""``scheduler: dra`` on the cluster side, against the real API server.

The node watch process lists and watches the ResourceSlices and
DeviceClasses the API server holds, and the workers size pods by the GPUs
published there; a DeviceClass that maps one of the policy's resources
(KEP-5004) is a log line and a gauge; a pending pod the webhook gave a
claim finds its template made in its namespace by the watch, and a
server-side dry run makes none.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.apiserver.helpers import (
    apply_server_side,
    create_namespace,
    create_pod,
    delete_namespaces,
    delete_nodes,
    gpu_container,
    pod_manifest,
    put_node,
    stored_pod,
    wait_for_service_account,
)
from tests.conftest import Server, start_watching, stop_server
from tests.controlplane.install import NS, Installed, service_account_kubeconfig
from tests.helpers import container, eventually, pod
from webhook import tls

GROUP, VERSION = "resource.k8s.io", "v1"
NAMESPACE = "dra-templates"
CLASS = "gpushare-test-gpu-mem"  # maps aliyun.com/gpu-mem: the KEP-5004 case


def resource_slice(name: str, node: str, *memory: str) -> dict[str, Any]:
    """A ResourceSlice of the default policy's driver: one shareable GPU per ``memory``."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{index}",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "memory": {
                            "value": size,
                            "requestPolicy": {
                                "default": size,
                                "validRange": {"min": "1Mi", "max": size, "step": "1Mi"},
                            },
                        }
                    },
                }
                for index, size in enumerate(memory)
            ],
        },
    }


def objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def delete_cluster_object(api: client.ApiClient, plural: str, name: str) -> None:
    with contextlib.suppress(ApiException):
        objects(api).delete_cluster_custom_object(GROUP, VERSION, plural, name)


@pytest.fixture(scope="module")
def dra_server(
    installed: Installed, tmp_path_factory: pytest.TempPathFactory, pki: tls.Issued
) -> Iterator[Server]:
    """``serve --watch-nodes`` with ``scheduler: dra``, as the webhook's ServiceAccount."""
    folder = tmp_path_factory.mktemp("dra-watch")
    policy = folder / "policy.yaml"
    policy.write_text("scheduler: dra\n")
    running = start_watching(
        pki, installed.webhook_kubeconfig, folder / "server.log", "--policy", str(policy),
        workers=1,
    )  # fmt: skip
    try:
        yield running
    finally:
        stop_server(running)


def refused_over(server: Server, gib: int, wanted: str) -> bool:
    answer = server.ask(pod(container(gpu=str(gib))))
    return answer["allowed"] is False and wanted in answer["status"]["message"]


def test_published_gpus_bound_a_pod(installed: Installed, dra_server: Server) -> None:
    api = installed.api
    body = resource_slice("gpushare-test-a", "dra-a", "24Gi", "24Gi")
    objects(api).create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
    try:
        eventually(lambda: refused_over(dra_server, 25, "the largest GPU has 24 GiB"))
        # 24 GiB is over the policy's own gpuMemory: only the published GPUs admit it.
        assert dra_server.ask(pod(container(gpu="24")))["allowed"] is True
        assert dra_server.metrics()["gpushare_gpu_sizes_from_policy"] == 0
    finally:
        delete_cluster_object(api, "resourceslices", "gpushare-test-a")
    eventually(lambda: dra_server.metrics()["gpushare_gpu_sizes_from_policy"] == 1)


def test_a_device_class_mapping_the_policys_resource_is_said(
    installed: Installed, dra_server: Server
) -> None:
    api = installed.api
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"extendedResourceName": "aliyun.com/gpu-mem"},
    }
    gauge = "gpushare_deviceclasses_mapping_gpu_resources"
    objects(api).create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
    try:
        eventually(lambda: dra_server.metrics()[gauge] == 1)
        said = f"DeviceClass {CLASS} (aliyun.com/gpu-mem) maps the policy's resources"
        eventually(lambda: said in dra_server.log.read_text())
    finally:
        delete_cluster_object(api, "deviceclasses", CLASS)
    eventually(lambda: dra_server.metrics()[gauge] == 0)
    eventually(lambda: "no DeviceClass maps the policy's resources" in dra_server.log.read_text())
    assert dra_server.log.read_text().count(said) == 1  # once, not at every look


@contextlib.contextmanager
def served_under_dra(installed: Installed) -> Iterator[None]:
    """The installed webhook (the one the API server calls) serving ``scheduler: dra``."""
    served = Path(installed.args[installed.args.index("--policy") + 1])
    before = served.read_text()
    policy = yaml.safe_load(before) or {}
    policy["scheduler"] = "dra"
    installed.set_policy(yaml.safe_dump(policy))
    try:
        yield
    finally:
        installed.set_policy(before)


def templates_in(api: client.ApiClient, namespace: str) -> list[str]:
    found = objects(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaimtemplates"
    )
    return sorted(item["metadata"]["name"] for item in found["items"])


def test_a_pending_pods_template_is_made_in_its_namespace(
    installed: Installed, dra_server: Server
) -> None:
    """Two servers watch the pods (the installed one and ``dra_server``), as two replicas do:
    whichever is first makes the template, the other's create is AlreadyExists, said nowhere."""
    api = installed.api

    def logs() -> str:
        return installed.server.log.read_text() + dra_server.log.read_text()

    create_namespace(api, NAMESPACE)
    wait_for_service_account(api, NAMESPACE)
    try:
        with served_under_dra(installed):
            core = client.CoreV1Api(api)
            # A size no other test of the tier asks: the logs are the installed server's, shared.
            dry = pod_manifest("dry", gpu_container(gpu="5"))
            core.create_namespaced_pod(NAMESPACE, dry, dry_run="All")
            made = create_pod(api, NAMESPACE, pod_manifest("train", gpu_container(gpu="4")))
            assert made["metadata"]["labels"]["gpushare-webhook.io/dra"] == "true"
            wanted = "gpushare-4096mi.gpu.nvidia.com"
            eventually(lambda: templates_in(api, NAMESPACE) == [wanted])
            template = objects(api).get_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "resourceclaimtemplates", wanted
            )
            request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
            assert request["capacity"]["requests"] == {"memory": "4Gi"}
            # The resourceclaim controller makes the pod's claim from it.
            eventually(
                lambda: (
                    stored_pod(api, NAMESPACE, "train")
                    .get("status", {})
                    .get("resourceClaimStatuses")
                ),
                timeout=30,
            )
            line = f"claim template {wanted} made in namespace {NAMESPACE}"
            assert logs().count(line) == 1
            assert "not made" not in logs()
            # The dry run's 5 GiB template was never made, nor asked for.
            assert "gpushare-5120mi" not in logs()
            made_total = "gpushare_claim_templates_created_total"
            servers = (installed.server, dra_server)
            eventually(lambda: sum(s.metrics()[made_total] for s in servers) >= 1)
            # A second pod of the same shape makes no call: the template is known.
            create_pod(api, NAMESPACE, pod_manifest("again", gpu_container(gpu="4")))
            time.sleep(0.5)
            # Made or not, each line about a template names its namespace: other tests'
            # pods in the shared server's log ask the same size elsewhere.
            here = f"claim template {wanted} (?:not )?made in namespace {NAMESPACE} "
            assert len(re.findall(here, logs())) == 1
    finally:
        delete_namespaces(api, NAMESPACE)


def test_the_policy_rbac_grants_what_the_watch_reads(installed: Installed) -> None:
    """The manifests' ClusterRole lets the watch list DRA objects and make templates."""
    plane = installed.plane
    account = "system:serviceaccount:gpushare-system:gpushare-webhook"
    for verb, resource in (
        ("list", "resourceslices.resource.k8s.io"),
        ("watch", "deviceclasses.resource.k8s.io"),
        ("create", "resourceclaimtemplates.resource.k8s.io"),
        ("watch", "pods"),
    ):
        answer = plane.kubectl("auth", "can-i", verb, resource, "--as", account, check=False)
        assert answer.stdout.strip() == "yes", (verb, resource, answer.stdout, answer.stderr)
    denied = plane.kubectl(
        "auth", "can-i", "delete", "resourceclaimtemplates.resource.k8s.io", "--as", account,
        check=False,
    )  # fmt: skip
    assert denied.stdout.strip() == "no"


NODES_ONLY = f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: gpushare-nodes-only, namespace: {NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: gpushare-nodes-only}}
rules:
  - {{apiGroups: [""], resources: [nodes], verbs: [list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: gpushare-nodes-only}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: gpushare-nodes-only}}
subjects: [{{kind: ServiceAccount, name: gpushare-nodes-only, namespace: {NS}}}]
"""


def test_rbac_without_the_dra_kinds_leaves_the_nodes_and_says_so_once(
    installed: Installed, tmp_path: Path, pki: tls.Issued
) -> None:
    """The RBAC of an older release (nodes only): each refused kind is one line, no traceback."""
    plane, api = installed.plane, installed.api
    apply_server_side(plane, NODES_ONLY)
    put_node(api, "rbac-a", memory=24, count=1)
    try:
        kubeconfig = service_account_kubeconfig(plane, "gpushare-nodes-only", tmp_path)
        log = tmp_path / "server.log"
        with start_watching(pki, kubeconfig, log, workers=1) as running:
            eventually(lambda: running.metrics()["gpushare_gpu_nodes"] == 1)
            refused = ("ResourceSlice", "DeviceClass", "claim template", "dra pod")
            for kind in refused:
                eventually(lambda kind=kind: f"{kind} watch: forbidden" in log.read_text())
            time.sleep(2)  # several more tries of each
            text = log.read_text()
            assert all(text.count(f"{kind} watch:") == 1 for kind in refused), text
            assert "Traceback" not in text
            assert running.ask(pod(container(gpu="25")))["allowed"] is False
    finally:
        plane.kubectl("delete", "-f", "-", "--ignore-not-found", stdin=NODES_ONLY)
        delete_nodes(api, seen_by=installed.server)
