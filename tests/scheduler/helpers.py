"""Pods through the scheduling tier: GPU pods, waiting for them to be bound, run or refused,
and what the extender wrote on them."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from tests.apiserver.helpers import create_pod, stored_pod
from tests.controlplane.scheduling import ANNOTATIONS, SchedulingPlane
from tests.helpers import GPU, container, eventually

__all__ = [
    "create_pod",
    "device_of",
    "extender_annotations",
    "gpu_pod",
    "stored_pod",
    "wait_bound",
    "wait_running",
    "wait_unschedulable",
]


def gpu_pod(
    name: str,
    gpu: str | None = "4",
    *,
    scheduler: str | None = None,
    requests: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    """A one-container pod asking ``gpu`` GiB of ``aliyun.com/gpu-mem`` as a limit (and as a
    request too, if ``requests``), with ``schedulerName`` when given."""
    main = container("main", gpu)
    if gpu is not None and requests:
        main["resources"]["requests"] = {GPU: gpu}
    body: dict[str, Any] = {"containers": [main], **spec}
    if scheduler:
        body["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


def wait_bound(
    api: client.ApiClient, namespace: str, name: str, *, timeout: float = 30
) -> dict[str, Any]:
    """The pod once bound to a node (``spec.nodeName`` set)."""
    found: dict[str, Any] = {}

    def bound() -> bool:
        found.update(stored_pod(api, namespace, name))
        return bool(found["spec"].get("nodeName"))

    _eventually(bound, timeout, lambda: _why(found))
    return found


def wait_running(
    api: client.ApiClient, namespace: str, name: str, *, timeout: float = 30
) -> dict[str, Any]:
    """The pod once KWOK reports it Running (bound, and Ready)."""
    found: dict[str, Any] = {}

    def running() -> bool:
        found.update(stored_pod(api, namespace, name))
        return bool(found.get("status", {}).get("phase") == "Running")

    _eventually(running, timeout, lambda: _why(found))
    return found


def wait_unschedulable(
    api: client.ApiClient, namespace: str, name: str, *, timeout: float = 30
) -> str:
    """The scheduler's message once it has found no node for the pod (its PodScheduled
    condition False, reason Unschedulable)."""
    found: dict[str, Any] = {}

    def refused() -> bool:
        found.update(stored_pod(api, namespace, name))
        return _condition(found) is not None

    _eventually(refused, timeout, lambda: _why(found))
    condition = _condition(found)
    assert condition is not None
    return str(condition.get("message", ""))


def _condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if (
            condition["type"] == "PodScheduled"
            and condition["status"] == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return dict(condition)
    return None


def _why(pod: dict[str, Any]) -> str:
    status = pod.get("status", {})
    return (
        f"node {pod.get('spec', {}).get('nodeName')!r}, phase {status.get('phase')!r}, "
        f"conditions {status.get('conditions')}"
    )


def _eventually(check: Any, timeout: float, why: Any) -> None:
    try:
        eventually(check, timeout=timeout)
    except AssertionError as error:
        raise AssertionError(f"{error}: {why()}") from None


def extender_annotations(pod: dict[str, Any]) -> dict[str, str]:
    """The ``ALIYUN_COM_GPU_MEM_*`` annotations the extender wrote on the pod."""
    annotations = pod["metadata"].get("annotations") or {}
    return {key: annotations[key] for key in ANNOTATIONS if key in annotations}


def device_of(plane: SchedulingPlane, node: str, namespace: str, name: str) -> int | None:
    """The GPU the extender's inspect endpoint shows the pod on, if any."""
    for found in plane.inspect(node)["nodes"]:
        for dev in found.get("devs") or []:
            for pod in dev.get("pods") or []:
                if pod["namespace"] == namespace and pod["name"] == name:
                    return int(dev["id"])
    return None
