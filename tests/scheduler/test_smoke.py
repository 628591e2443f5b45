"""The scheduling tier works: a GPU pod is bound by the extender to a fake GPU node, gets the
extender's annotations and runs under KWOK, in both scheduler configurations; and so does one
the webhook, installed into the cluster, has mutated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from kubernetes import client

from tests.controlplane.install import Installed, render_manifests
from tests.controlplane.scheduling import ANNOTATIONS, GPUSHARE_SCHEDULER, SchedulingPlane
from tests.scheduler.helpers import (
    create_pod,
    device_of,
    extender_annotations,
    gpu_pod,
    wait_running,
)

OPTED_OUT = {"gpushare-webhook.io/injection": "disabled"}  # the webhook configuration skips it
POLICY = "gpushare-webhook-policy"


def test_a_gpu_pod_is_bound_by_the_extender_and_runs(
    scheduler: SchedulingPlane,
    api: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., dict[str, Any]],
) -> None:
    # The extender alone: once another test has installed the webhook, it would set the pod
    # up under whatever policy that test left; this namespace opts out of it.
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": OPTED_OUT}})
    node = f"gpu-{scheduler.configuration}"
    stored = gpu_node(node, gpus=4, memory=16)
    assert stored["status"]["allocatable"]["aliyun.com/gpu-mem"] == "64"
    assert stored["status"]["allocatable"]["aliyun.com/gpu-count"] == "4"
    # Under "profiles" the pod names the second profile; the extender serves both.
    name = "train"
    profile = GPUSHARE_SCHEDULER if scheduler.configuration == "profiles" else None
    create_pod(api, namespace, gpu_pod(name, "4", scheduler=profile))

    pod = wait_running(api, namespace, name)

    assert pod["spec"]["nodeName"] == node
    written = extender_annotations(pod)
    assert set(written) == set(ANNOTATIONS)
    assert written["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert written["ALIYUN_COM_GPU_MEM_DEV"] == "16"
    assert written["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"  # the device plugin's to set
    assert int(written["ALIYUN_COM_GPU_MEM_ASSUME_TIME"]) > 0
    index = int(written["ALIYUN_COM_GPU_MEM_IDX"])
    assert index in range(4)
    assert device_of(scheduler, node, namespace, name) == index
    (seen,) = scheduler.inspect(node)["nodes"]
    assert (seen["totalGPU"], seen["usedGPU"]) == (64, 4)


def test_a_pod_the_webhook_mutated_is_bound_and_runs(
    installed: Installed,
    scheduler: SchedulingPlane,
    api: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., dict[str, Any]],
) -> None:
    # The policy as shipped, from the manifests (other tests change the ConfigMap).
    (shipped,) = [
        doc
        for doc in yaml.safe_load_all(render_manifests())
        if doc and doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == POLICY
    ]
    installed.set_policy(shipped["data"]["policy.yaml"])  # the webhook restarted with it
    node = f"webhook-{scheduler.configuration}"
    # The shipped policy places GPU pods only where the node agent has labelled the node.
    gpu_node(node, gpus=2, memory=24, labels={"gpushare-webhook.io/shim": "0123456789ab"})
    before = installed.reviews()
    create_pod(api, namespace, gpu_pod("mutated", "8"))

    pod = wait_running(api, namespace, "mutated")

    # Twice: the ServiceAccount plugin mounts its token in the init step the webhook
    # added, so the API server calls the webhook again (IfNeeded); it changes nothing.
    assert installed.reviews() == before + 2
    assert pod["spec"]["initContainers"][0]["name"] == "gpushare-regions"
    # The shipped policy: the extender's install guide, default-scheduler (every configuration).
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["spec"]["nodeName"] == node
    assert pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] == "8"
    assert device_of(scheduler, node, namespace, "mutated") is not None
