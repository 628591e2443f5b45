"""Pods through the scheduling tier: GPU pods, waiting for them to be bound, run or refused,
and what the extender wrote on them."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.apiserver.helpers import create_pod, refusal, stored_pod
from tests.controlplane.install import Installed
from tests.controlplane.scheduling import ANNOTATIONS, SchedulingPlane
from tests.helpers import GPU, container, eventually, pod

__all__ = [
    "Pipeline",
    "check_agreement",
    "create_pod",
    "device_of",
    "extender_annotations",
    "gpu_limits",
    "gpu_pod",
    "pods_of",
    "refusal_reasons",
    "reserved_mib",
    "run_report",
    "scheduling_events",
    "stored_pod",
    "use_policy",
    "wait_bound",
    "wait_running",
    "wait_unschedulable",
    "wait_webhook_sees",
    "workload_template",
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
    if scheduler:
        spec["schedulerName"] = scheduler
    return pod(main, name=name, namespace=None, **spec)


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
            for placed in dev.get("pods") or []:
                if placed["namespace"] == namespace and placed["name"] == name:
                    return int(dev["id"])
    return None


# What the webhook writes on a pod it set up, read back to check it against the extender's.
STATUS = "gpushare-webhook.io/status"
LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
AUDIT = "pods.gpushare-webhook.io"  # the prefix of its audit annotations


def mib(value: str) -> int:
    """A shim limit (``"4096m"``: MiB) as a number of MiB."""
    assert re.fullmatch(r"[0-9]+m", value), f"not a shim limit: {value!r}"
    return int(value[:-1])


def gpu_limits(pod: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each GPU-memory container's shim limits in MiB: ``{container: {env name: MiB}}``
    (``CUDA_DEVICE_MEMORY_LIMIT`` and each ``CUDA_DEVICE_MEMORY_LIMIT_<i>``)."""
    spec = pod["spec"]
    found: dict[str, dict[str, int]] = {}
    for each in [*spec.get("initContainers", []), *spec["containers"]]:
        if GPU not in (each.get("resources") or {}).get("limits", {}):
            continue
        env = {e["name"]: e.get("value") for e in each.get("env") or []}
        found[each["name"]] = {
            name: mib(value)
            for name, value in env.items()
            if name == LIMIT or (name.startswith(f"{LIMIT}_") and name[len(LIMIT) + 1 :].isdigit())
        }
    return found


def reserved_mib(pod: dict[str, Any]) -> int:
    """What the extender reserved for the pod on its GPU (``ALIYUN_COM_GPU_MEM_POD``), in MiB."""
    return int(pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"]) * 1024


def check_agreement(pod: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The pod carries the extender's annotations and the webhook's set-up, and they agree: every
    GPU-memory container has its limits (``CUDA_DEVICE_MEMORY_LIMIT`` and ``_0``), as the status
    annotation records them, and none exceeds what the extender reserved. The limits (MiB)."""
    name = pod["metadata"]["name"]
    annotations = pod["metadata"].get("annotations") or {}
    missing = [key for key in (*ANNOTATIONS, STATUS) if key not in annotations]
    assert not missing, f"pod {name}: no {missing} in {annotations}"
    status = json.loads(annotations[STATUS])
    limits = gpu_limits(pod)
    assert limits, f"pod {name}: no GPU-memory container"
    reserved = reserved_mib(pod)
    for each, found in limits.items():
        assert {LIMIT, f"{LIMIT}_0"} <= set(found), f"pod {name}, {each}: {found}"
        assert status["containers"][each]["memory"] == f"{found[LIMIT]}m"
        over = {env: value for env, value in found.items() if value > reserved}
        assert not over, (
            f"pod {name}, container {each}: limits {over} MiB exceed the {reserved} MiB "
            f"the extender reserved on GPU {annotations['ALIYUN_COM_GPU_MEM_IDX']}"
        )
    return limits


def use_policy(installed: Installed, text: str) -> None:
    """Serve with policy ``text``, restarting the webhook only if it serves another one."""
    mounted = Path(installed.args[installed.args.index("--policy") + 1])
    if mounted.read_text() != text:
        installed.set_policy(text)


def wait_webhook_sees(installed: Installed, *, largest_gib: int) -> None:
    """Until the webhook's node watch checks pods against a largest GPU of ``largest_gib``."""

    def seen() -> bool:
        # Each scrape is answered by one worker, and each worker follows the node
        # snapshot on its own: several scrapes in a row reach every worker.
        return all(
            installed.server.metrics().get("gpushare_largest_gpu_memory_bytes")
            == largest_gib * 2**30
            for _ in range(6)
        )

    eventually(seen, timeout=30)


def scheduling_events(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    """The messages of the pod's FailedScheduling events."""
    core = client.CoreV1Api(api)
    found = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason=FailedScheduling"
    )
    return [event.message or "" for event in found.items]


def run_report(*args: str) -> tuple[int, dict[str, Any]]:
    """``gpushare-webhook report --output=json`` run as the command: its exit code and JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "report", "--output=json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, found


def refusal_reasons(plane: SchedulingPlane, namespace: str, name: str) -> list[str]:
    """The reasons the webhook gave the API server's audit log for refusing the pod's create
    (its ``pods.gpushare-webhook.io/reason``, or ``reasons`` when there were several)."""
    found: dict[str, str] = {}

    def logged() -> bool:
        for line in plane.audit_log.read_text().splitlines():
            event = json.loads(line)
            ref = event.get("objectRef", {})
            if (
                ref.get("resource") == "pods"
                and ref.get("namespace") == namespace
                and ref.get("name") == name
                and event.get("verb") == "create"
                and event.get("stage") == "ResponseComplete"
            ):
                found.update(event.get("annotations", {}))
                return True
        return False

    eventually(logged, timeout=15)
    assert found.get(f"{AUDIT}/decision") == "rejected", found
    return found.get(f"{AUDIT}/reasons", found.get(f"{AUDIT}/reason", "")).split(",")


_NODES = itertools.count(1)


@dataclass
class Pipeline:
    """The whole pipeline for one test: the webhook installed into the cluster, kube-scheduler
    with the extender, KWOK, and a namespace and fake GPU nodes of the test's own."""

    installed: Installed
    plane: SchedulingPlane
    api: client.ApiClient
    namespace: str
    make_node: Callable[..., dict[str, Any]]

    def policy(self, text: str) -> None:
        """The webhook serves policy ``text`` (restarted only if it served another)."""
        use_policy(self.installed, text)

    def node(self, prefix: str, **options: Any) -> str:
        """A new fake GPU node (tests.controlplane.scheduling.put_gpu_node's options), deleted
        after the test; its name never used before: the extender keeps a node's GPUs from the
        first time it sees its name, even after the Node is deleted."""
        name = f"{prefix}-{next(_NODES)}"
        self.make_node(name, **options)
        return name

    def create(self, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return create_pod(self.api, namespace or self.namespace, body)

    def placed(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        """The pod once Running, checked: the extender's record and the webhook's limits
        agree (check_agreement)."""
        pod = wait_running(self.api, namespace or self.namespace, name)
        check_agreement(pod)
        return pod

    def pending(self, name: str) -> str:
        """The pod's PodScheduled message once the scheduler found no node for it (unbound)."""
        message = wait_unschedulable(self.api, self.namespace, name)
        assert not stored_pod(self.api, self.namespace, name)["spec"].get("nodeName")
        return message

    def refused(self, body: dict[str, Any]) -> tuple[str, list[str]]:
        """The API server's message refusing the pod's create, and the webhook's reasons."""
        message = refusal(lambda: self.create(body))
        return message, refusal_reasons(self.plane, self.namespace, body["metadata"]["name"])

    def stored(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        return stored_pod(self.api, namespace or self.namespace, name)

    def report(self, *args: str) -> tuple[int, dict[str, Any]]:
        """``gpushare-webhook report`` of the cluster, run as the command, as the admin."""
        return run_report("--kubeconfig", str(self.plane.kubeconfig), *args)


def workload_template(app: str, gpu: str, **spec: Any) -> dict[str, Any]:
    """A Deployment's or Job's pod template: one container asking ``gpu``, labelled ``app``."""
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {"containers": [container("main", gpu)], **spec},
    }


def pods_of(pipeline: Pipeline, app: str) -> list[dict[str, Any]]:
    """The stored pods labelled ``app`` in the pipeline's namespace."""
    core = client.CoreV1Api(pipeline.api)
    found = core.list_namespaced_pod(pipeline.namespace, label_selector=f"app={app}")
    return [pipeline.stored(each.metadata.name) for each in found.items]
