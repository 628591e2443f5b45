"""One answer for what is used: ``gpushare-webhook report`` and the extender's inspect agree.

The cluster is filled with a mix: pods the webhook set up, one with a GPU init container, one in
a namespace the policy excludes (the webhook is called and leaves it alone), and one the webhook
would refuse (an init container asking more than the app containers' sum) in a namespace that
opted out of it, so the webhook never saw it. All are placed by the extender and Running. Then,
for every node and GPU, the report's ``nodes[].used``, ``devices[].used``, ``free`` and pods are
what the extender's inspect endpoint says, exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.apiserver.helpers import create_namespace, wait_for_service_account
from tests.helpers import container, eventually
from tests.scheduler.helpers import Pipeline, gpu_pod, wait_running, wait_webhook_sees

OPTED_OUT = {"gpushare-webhook.io/injection": "disabled"}  # the webhook configuration skips it


@pytest.fixture
def others(pipeline: Pipeline) -> Iterator[tuple[str, str]]:
    """Two more namespaces: one the policy excludes, one that opted out of the webhook; their
    pods deleted and they too after the test."""
    excluded, opted_out = f"{pipeline.namespace}-excluded", f"{pipeline.namespace}-opted-out"
    create_namespace(pipeline.api, excluded)
    create_namespace(pipeline.api, opted_out, OPTED_OUT)
    for name in (excluded, opted_out):
        wait_for_service_account(pipeline.api, name)
    yield excluded, opted_out
    for name in (excluded, opted_out):
        empty(pipeline.api, name)


def empty(api: client.ApiClient, namespace: str) -> None:
    """Delete the namespace's pods at once, wait until they are gone, then delete it."""
    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    eventually(lambda: not core.list_namespaced_pod(namespace).items, timeout=30)
    with contextlib.suppress(ApiException):
        core.delete_namespace(namespace)


def with_init(name: str, app: str, init: str) -> dict[str, Any]:
    body = gpu_pod(name, app)
    body["spec"]["initContainers"] = [container("warmup", init)]
    return body


def test_the_report_and_the_extender_agree_on_every_node_and_gpu(
    pipeline: Pipeline, others: tuple[str, str]
) -> None:
    excluded, opted_out = others
    policy = {"excludeNamespaces": ["kube-system", "gpushare-system", excluded]}
    pipeline.policy(yaml.safe_dump(policy))
    nodes = [
        pipeline.node("ledger-a", gpus=2, memory=8),
        pipeline.node("ledger-b", gpus=1, memory=16),
        pipeline.node("ledger-countless", gpus=2, memory=8, gpu_count=False),
    ]
    wait_webhook_sees(pipeline.installed, largest_gib=16)
    ours = pipeline.namespace
    # Made in this order, they fit wherever the extender puts each (13 GiB of the 22 left
    # once "wide" holds ledger-b's GPU, none larger than 4). kube-scheduler counts the larger
    # of an init container and the app containers on the node, and places by nodes alone (it
    # may put "small" on ledger-b): "unchecked"'s init asks 2, which one of the two nodes
    # always has (10 GiB left between them). An init of 6 could find neither (5 and 5).
    made = {
        (ours, "wide"): gpu_pod("wide", "10"),  # only ledger-b's one GPU holds it
        (ours, "small"): gpu_pod("small", "1"),
        (ours, "medium"): gpu_pod("medium", "2"),
        (ours, "large"): gpu_pod("large", "4"),
        (ours, "warmed"): with_init("warmed", "2", "2"),
        (excluded, "left-alone"): gpu_pod("left-alone", "3"),
        (opted_out, "unchecked"): with_init("unchecked", "1", "2"),  # the webhook would refuse
    }
    for (namespace, _), body in made.items():
        pipeline.create(body, namespace)
    for namespace, name in made:
        if namespace == ours:
            pipeline.placed(name)  # set up by the webhook, its limits within the reservation
        else:
            pod = wait_running(pipeline.api, namespace, name)
            assert "gpushare-webhook.io/status" not in pod["metadata"]["annotations"]

    _, found = pipeline.report()

    statuses = {(p["namespace"], p["name"]): p["status"] for p in found["pods"]}
    assert statuses[excluded, "left-alone"] == "excluded"
    assert statuses[opted_out, "unchecked"] == "would-be-refused"
    assert all(statuses[ours, name] == "confined" for namespace, name in made if namespace == ours)
    reported = {node["name"]: node for node in found["nodes"]}
    for name in nodes:
        (seen,) = pipeline.plane.inspect(name)["nodes"]
        node = reported[name]
        assert (node["total"], node["used"]) == (seen["totalGPU"], seen["usedGPU"]), name
        devs = seen["devs"] or []
        assert node["free"] == sum(dev["totalGPU"] - dev["usedGPU"] for dev in devs), name
        assert [
            (d["index"], d["total"], d["used"], d["free"],
             sorted((p["namespace"], p["name"], p["heldPerGpu"]) for p in d["pods"]))
            for d in node["devices"]
        ] == [
            (dev["id"], dev["totalGPU"], dev["usedGPU"], dev["totalGPU"] - dev["usedGPU"],
             sorted((p["namespace"], p["name"], p["usedGPU"]) for p in dev["pods"] or []))
            for dev in devs
        ], name  # fmt: skip
    # Every pod is counted, by both, on the GPU its annotations name, with what they reserve.
    assert sum(reported[name]["used"] for name in nodes) == 10 + 1 + 2 + 4 + 2 + 3 + 1
    assert (reported[nodes[2]]["gpus"], reported[nodes[2]]["free"]) == (0, 0)
    for (namespace, name), body in made.items():
        pod = pipeline.stored(name, namespace)
        annotations = pod["metadata"]["annotations"]
        (listed,) = [p for p in found["pods"] if (p["namespace"], p["name"]) == (namespace, name)]
        assert listed["node"] == pod["spec"]["nodeName"]
        assert listed["gpu"] == int(annotations["ALIYUN_COM_GPU_MEM_IDX"])
        assert listed["reserved"] == int(annotations["ALIYUN_COM_GPU_MEM_POD"])
        assert listed["reserved"] == int(body["spec"]["containers"][0]["resources"]["limits"][
            "aliyun.com/gpu-mem"])  # fmt: skip
