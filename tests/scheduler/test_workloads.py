"""Workloads through the whole pipeline: pods a Deployment and a Job make (kube-controller-manager
runs their controllers) are set up by the webhook, placed by kube-scheduler with the extender and
run under KWOK, their limits within what the extender reserved, in both scheduler configurations.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from tests.helpers import eventually
from tests.scheduler.helpers import Pipeline, check_agreement, pods_of, workload_template

DEFAULT = "{}\n"


def test_a_deployments_and_a_jobs_pods_are_set_up_placed_and_run(pipeline: Pipeline) -> None:
    pipeline.policy(DEFAULT)
    node = pipeline.node("workloads", gpus=2, memory=8)
    apps, batch = client.AppsV1Api(pipeline.api), client.BatchV1Api(pipeline.api)
    labels = {"app": "serving"}
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serving"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": workload_template("serving", "3")},
    }  # fmt: skip
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "backoffLimit": 0,
            "template": workload_template("train", "5", restartPolicy="Never"),
        },
    }
    apps.create_namespaced_deployment(pipeline.namespace, deployment)
    batch.create_namespaced_job(pipeline.namespace, job)
    try:

        def serving() -> bool:
            pods = pods_of(pipeline, "serving")
            return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

        eventually(serving, timeout=60)
        for pod in pods_of(pipeline, "serving"):
            assert pod["spec"]["nodeName"] == node
            assert pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] == "3"
            assert check_agreement(pod)["main"]["CUDA_DEVICE_MEMORY_LIMIT"] == 3 * 1024

        # KWOK runs a Job's pod, then ends it (its pod-complete stage): the Job succeeds.
        def succeeded() -> bool:
            return bool(batch.read_namespaced_job("train", pipeline.namespace).status.succeeded)

        eventually(succeeded, timeout=60)
        (trained,) = pods_of(pipeline, "train")
        assert trained["status"]["phase"] == "Succeeded"
        assert trained["spec"]["nodeName"] == node
        assert trained["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] == "5"
        assert check_agreement(trained)["main"]["CUDA_DEVICE_MEMORY_LIMIT"] == 5 * 1024

        # Its pod ended: the extender no longer counts it, the Deployment's two still are.
        def used() -> int:
            (seen,) = pipeline.plane.inspect(node)["nodes"]
            return int(seen["usedGPU"])

        eventually(lambda: used() == 6)
    finally:
        gone = client.V1DeleteOptions(propagation_policy="Foreground", grace_period_seconds=0)
        apps.delete_namespaced_deployment("serving", pipeline.namespace, body=gone)
        batch.delete_namespaced_job("train", pipeline.namespace, body=gone)
        eventually(lambda: not apps.list_namespaced_deployment(pipeline.namespace).items, 30)
