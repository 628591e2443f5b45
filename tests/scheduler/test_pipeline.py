"""GPU pods through the whole pipeline: created through the API server, set up (or refused) by the
webhook installed into the cluster, placed by kube-scheduler with the GPU Share Scheduler Extender,
bound, and Running under KWOK. Read back, each placed pod carries both the extender's
annotations and the webhook's limits, and no container's limit exceeds what the extender
reserved for the pod on its GPU (tests.scheduler.helpers.check_agreement).

The webhook is installed with the default policy (scheduler: gpushare-extender, schedulerName:
default-scheduler) unless a case needs another. It watches the Nodes (``--watch-nodes``), so it
checks pods against the fake nodes' GPUs.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.scheduling import GPU_COUNT, GPUSHARE_SCHEDULER
from tests.helpers import GPU, container, eventually
from tests.scheduler.helpers import (
    Pipeline,
    check_agreement,
    device_of,
    gpu_pod,
    run_report,
    scheduling_events,
    wait_running,
    wait_webhook_sees,
)

DEFAULT = "{}\n"  # every key its default: the extender, schedulerName default-scheduler
PROFILE = f"schedulerName: {GPUSHARE_SCHEDULER}\n"
ACK = "scheduler: ack\n"
EXTENDER_REFUSES = "Insufficient GPU Memory in one device"  # its filter's message, per node
SCHEDULER_REFUSES = f"Insufficient {GPU}"  # kube-scheduler's own fit: the node's total is used


def mib(gib: str) -> int:
    return int(gib) * 1024


@pytest.mark.parametrize(
    ("configuration", "policy", "scheduler_name"),
    [
        ("install-guide", DEFAULT, "default-scheduler"),  # as the extender's install guide has it
        ("profiles", DEFAULT, "default-scheduler"),
        ("profiles", PROFILE, GPUSHARE_SCHEDULER),  # a profile of its own for GPU pods
    ],
    ids=["install-guide", "profiles-default", "profiles-gpushare-scheduler"],
)
def test_gpu_pods_are_placed_with_limits_within_their_reservation(
    pipeline: Pipeline, policy: str, scheduler_name: str
) -> None:
    pipeline.policy(policy)
    node = pipeline.node("newcomer", gpus=2, memory=8)
    sizes = {"first": "4", "second": "2", "third": "6", "fourth": "1"}
    for name, size in sizes.items():
        pipeline.create(gpu_pod(name, size))

    by_gpu: dict[int, int] = {}
    placements: dict[str, int | None] = {}
    for name, size in sizes.items():
        pod = pipeline.placed(name)
        assert pod["spec"]["schedulerName"] == scheduler_name
        assert pod["spec"]["nodeName"] == node
        annotations = pod["metadata"]["annotations"]
        assert (annotations["ALIYUN_COM_GPU_MEM_POD"], annotations["ALIYUN_COM_GPU_MEM_DEV"]) == (
            size,
            "8",
        )
        limit = {"CUDA_DEVICE_MEMORY_LIMIT": mib(size), "CUDA_DEVICE_MEMORY_LIMIT_0": mib(size)}
        assert check_agreement(pod) == {"main": limit}
        placements[name] = index = int(annotations["ALIYUN_COM_GPU_MEM_IDX"])
        by_gpu[index] = by_gpu.get(index, 0) + int(size)

    def inspected() -> dict[str, int | None]:
        return {name: device_of(pipeline.plane, node, pipeline.namespace, name) for name in sizes}

    eventually(lambda: inspected() == placements)  # the GPU of each pod, as the extender has it
    (seen,) = pipeline.plane.inspect(node)["nodes"]
    assert {dev["id"]: dev["usedGPU"] for dev in seen["devs"] if dev["usedGPU"]} == by_gpu
    assert max(by_gpu.values()) <= 8


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_a_pod_for_a_scheduler_no_profile_serves_waits_and_the_report_names_it(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    # The policy sends GPU pods to gpushare-scheduler; under install-guide only
    # default-scheduler runs, so nothing ever looks at them.
    pipeline.policy(PROFILE)
    pipeline.node("unserved", gpus=2, memory=8)
    pipeline.create(gpu_pod("waiting", "4"))
    # A pod for default-scheduler, made after it, is placed: the scheduler had its chance.
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
             "spec": {"containers": [container("main")]}}  # fmt: skip
    pipeline.create(plain)
    wait_running(pipeline.api, pipeline.namespace, "plain")

    pod = pipeline.stored("waiting")
    assert pod["spec"]["schedulerName"] == GPUSHARE_SCHEDULER
    assert not pod["spec"].get("nodeName")
    assert pod["status"]["phase"] == "Pending"
    assert not [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    assert not scheduling_events(pipeline.api, pipeline.namespace, "waiting")

    # The report, run now: the pod is set up and on no node; that nobody answers it takes a
    # minute without a scheduling event to say, and the pod is seconds old.
    _, now = pipeline.report("-n", pipeline.namespace)
    (listed,) = [p for p in now["pods"] if p["name"] == "waiting"]
    assert (listed["node"], listed["status"], listed["gpu"]) == ("", "confined", None)
    assert now["unanswered"] == []
    # The same objects saved with their creation moved two minutes back (the report reads
    # the clock itself): it names the pod and the scheduler it waits for.
    saved = json.loads(pipeline.plane.kubectl("get", "pods,nodes", "-A", "-o", "json").stdout)
    for item in saved["items"]:
        made = datetime.fromisoformat(item["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        earlier = made - timedelta(minutes=2)
        item["metadata"]["creationTimestamp"] = earlier.strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / "cluster.json").write_text(json.dumps(saved))
    (tmp_path / "policy.yaml").write_text(PROFILE)
    code, later = run_report(
        "--from", str(tmp_path / "cluster.json"), "--policy", str(tmp_path / "policy.yaml")
    )
    assert code == 1
    (waiting,) = later["unanswered"]
    assert waiting["schedulerName"] == GPUSHARE_SCHEDULER
    assert waiting["pods"] == [f"{pipeline.namespace}/waiting"]
    assert waiting["message"].startswith(
        f"1 GPU pod waits for scheduler '{GPUSHARE_SCHEDULER}', which no scheduler answers"
    )
    assert later["summary"]["unanswered"] == 1


@pytest.mark.parametrize("size", ["7", "8", "9"])
def test_pods_around_a_gpus_size(pipeline: Pipeline, size: str) -> None:
    pipeline.policy(DEFAULT)
    node = pipeline.node("boundary", gpus=2, memory=8)
    wait_webhook_sees(pipeline.installed, largest_gib=8)  # checks pods against the nodes
    name = f"asks-{size}"

    if int(size) > 8:
        message, reasons = pipeline.refused(gpu_pod(name, size))
        assert (
            f"container 'main' asks {size} GiB of {GPU} per GPU, but the largest GPU has 8 GiB "
            "(1 node of the cluster's GPU nodes): the pod could never be scheduled; ask at most 8"
        ) in message
        assert reasons == ["exceeds-gpu"]
        return
    pipeline.create(gpu_pod(name, size))
    pod = pipeline.placed(name)
    assert pod["spec"]["nodeName"] == node
    assert pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] == size


@pytest.mark.parametrize(
    ("fill", "next_size", "why"),
    [
        # Every GiB reserved: kube-scheduler's own fit refuses the node before the extender
        # is asked (it manages aliyun.com/gpu-mem without hiding it from kube-scheduler).
        (["8", "4", "3", "1"], "1", SCHEDULER_REFUSES),
        # 4 GiB left on the node, 2 on each GPU: only the extender sees they are apart.
        (["6", "6"], "4", EXTENDER_REFUSES),
    ],
    ids=["full", "fragmented"],
)
def test_a_filled_cluster_leaves_the_next_pod_pending(
    pipeline: Pipeline, fill: list[str], next_size: str, why: str
) -> None:
    pipeline.policy(DEFAULT)
    node = pipeline.node("filled", gpus=2, memory=8)
    for index, size in enumerate(fill):
        pipeline.create(gpu_pod(f"fill-{index}", size))
        pipeline.placed(f"fill-{index}")
    (seen,) = pipeline.plane.inspect(node)["nodes"]
    assert seen["usedGPU"] == sum(int(size) for size in fill)

    pipeline.create(gpu_pod("next", next_size))
    message = pipeline.pending("next")

    assert f"0/1 nodes are available: 1 {why}" in message
    events = scheduling_events(pipeline.api, pipeline.namespace, "next")
    assert any(why in event for event in events), events
    (after,) = pipeline.plane.inspect(node)["nodes"]
    assert after["usedGPU"] == seen["usedGPU"]


@pytest.mark.parametrize("init", ["2", "4", "6"])
def test_an_init_container_asks_at_most_the_app_containers_sum(
    pipeline: Pipeline, init: str
) -> None:
    pipeline.policy(DEFAULT)
    node = pipeline.node("init", gpus=2, memory=8)
    name = f"init-{init}"
    body = gpu_pod(name, "4")
    body["spec"]["initContainers"] = [container("warmup", init)]

    if int(init) > 4:
        message, reasons = pipeline.refused(body)
        assert (
            f"init container 'warmup' asks {init} GiB of {GPU}, but the pod's app containers "
            "together ask 4 GiB, and the GPU Share Scheduler Extender holds only that on the GPU "
            "it picks (it does not count init containers)"
        ) in message
        assert reasons == ["init-exceeds-reservation"]
        return
    pipeline.create(body)
    pod = pipeline.placed(name)
    # The extender reserves the app containers' sum; the init container's limit is within it.
    assert pod["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert check_agreement(pod)["warmup"]["CUDA_DEVICE_MEMORY_LIMIT"] == mib(init)
    (seen,) = pipeline.plane.inspect(node)["nodes"]
    assert seen["usedGPU"] == 4


def _two_gpus(name: str, memory: str, *, as_resource: bool = False) -> dict[str, Any]:
    body = gpu_pod(name, memory)
    if as_resource:
        body["spec"]["containers"][0]["resources"]["limits"][GPU_COUNT] = "2"
    else:
        body["metadata"]["labels"] = {GPU_COUNT: "2"}
    return body


@pytest.mark.parametrize("configuration", ["install-guide"])
@pytest.mark.parametrize("as_resource", [False, True], ids=["label", "resource"])
def test_a_multi_gpu_pod_is_refused_under_the_extender(
    pipeline: Pipeline, as_resource: bool
) -> None:
    pipeline.policy(DEFAULT)
    pipeline.node("multi", gpus=2, memory=8)

    message, reasons = pipeline.refused(_two_gpus("spans", "8", as_resource=as_resource))

    where = f"container 'main' limit {GPU_COUNT}" if as_resource else f"the pod's label {GPU_COUNT}"
    assert (
        f"{where} asks 2 GPUs, but the GPU Share Scheduler Extender places a pod on one GPU and "
        "does not read the count"
    ) in message
    assert reasons == ["multi-gpu-unsupported"]


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_under_ack_a_multi_gpu_pod_is_admitted_and_the_extender_gives_it_one_gpu(
    pipeline: Pipeline,
) -> None:
    # Why the default refuses the count: the extender never reads it. Under scheduler: ack
    # the webhook sets the pod up for two GPUs (its memory split over them), and the
    # extender places it on one GPU and reserves the whole ask there: the pod's limits name a
    # second GPU it never gets. A pod asking more than one GPU holds, which ACK would spread
    # over two, is admitted and then never placed.
    pipeline.policy(ACK)
    node = pipeline.node("ack", gpus=4, memory=8)
    wait_webhook_sees(pipeline.installed, largest_gib=8)
    pipeline.create(_two_gpus("two-by-four", "8"))
    pipeline.create(_two_gpus("two-by-eight", "16"))

    pod = pipeline.placed("two-by-four")
    annotations = pod["metadata"]["annotations"]
    assert (annotations["ALIYUN_COM_GPU_MEM_POD"], annotations["ALIYUN_COM_GPU_MEM_DEV"]) == (
        "8",
        "8",
    )
    index = int(annotations["ALIYUN_COM_GPU_MEM_IDX"])  # one GPU: it has no other form
    assert check_agreement(pod) == {
        "main": {
            "CUDA_DEVICE_MEMORY_LIMIT": 4096,
            "CUDA_DEVICE_MEMORY_LIMIT_0": 4096,
            "CUDA_DEVICE_MEMORY_LIMIT_1": 4096,
        }
    }
    (seen,) = pipeline.plane.inspect(node)["nodes"]
    assert [dev["usedGPU"] for dev in seen["devs"]] == [8 if i == index else 0 for i in range(4)]

    # 24 GiB left on the node, 8 on each GPU: the extender finds no GPU of 16.
    assert f"0/1 nodes are available: 1 {EXTENDER_REFUSES}" in pipeline.pending("two-by-eight")


@pytest.mark.parametrize("configuration", ["profiles"])
def test_a_node_without_a_gpu_count_gets_no_pod(pipeline: Pipeline) -> None:
    pipeline.policy(DEFAULT)
    countless = pipeline.node("countless", gpus=2, memory=8, gpu_count=False)
    counted = pipeline.node("counted", gpus=1, memory=8)
    wait_webhook_sees(pipeline.installed, largest_gib=8)
    assert pipeline.installed.server.metrics()["gpushare_gpu_nodes_without_count"] == 1
    for name in ("one", "two"):
        pipeline.create(gpu_pod(name, "4"))
        assert pipeline.placed(name)["spec"]["nodeName"] == counted

    # 16 GiB free by the count-less node's capacity, but the extender made it no GPU.
    pipeline.create(gpu_pod("three", "2"))
    message = pipeline.pending("three")
    assert f"1 {EXTENDER_REFUSES}" in message  # the count-less node
    assert f"1 {SCHEDULER_REFUSES}" in message  # the counted one, full
    (seen,) = pipeline.plane.inspect(countless)["nodes"]
    assert (seen["totalGPU"], seen["usedGPU"], seen["devs"]) == (16, 0, [])
    _, found = pipeline.report("-n", pipeline.namespace)
    (reported,) = [n for n in found["nodes"] if n["name"] == countless]
    assert (reported["gpus"], reported["total"], reported["used"]) == (0, 16, 0)
    assert (reported["free"], reported["devices"]) == (0, [])


def test_a_pending_pod_is_placed_on_a_node_added_later(pipeline: Pipeline) -> None:
    pipeline.policy(DEFAULT)
    pipeline.node("first", gpus=1, memory=8)
    pipeline.create(gpu_pod("big", "8"))
    pipeline.placed("big")
    pipeline.create(gpu_pod("late", "4"))
    pipeline.pending("late")

    later = pipeline.node("later", gpus=1, memory=8)

    pod = pipeline.placed("late")
    assert pod["spec"]["nodeName"] == later
    eventually(lambda: device_of(pipeline.plane, later, pipeline.namespace, "late") == 0)
