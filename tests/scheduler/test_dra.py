"""``scheduler: dra`` against the real kube-scheduler: GPUs published as ResourceSlices (as
NVIDIA's driver publishes them with consumable shares, tests/controlplane/dra.py) on fake nodes
KWOK plays, claims allocated by kube-scheduler's DynamicResources plugin with consumable capacity,
and made and deleted by kube-controller-manager's resourceclaim controller.

No webhook in the first test: explicit claims show the tier's DRA works on its own; nor in the
KEP-5004 one under the ``no-extender`` configuration, which shows what kube-scheduler alone does
with ``aliyun.com/gpu-mem`` mapped to a DeviceClass. The rest take pods through the whole pipeline
with the webhook serving ``scheduler: dra`` (and ``gpushare-extender`` where a test compares),
on nodes the module shares; each test leaves their GPUs free (``on_pool``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.controlplane import dra
from tests.controlplane.install import Installed
from tests.controlplane.scheduling import GPU_COUNT, NO_EXTENDER, node_ready, put_gpu_node
from tests.helpers import GPU, container, eventually, pod
from tests.scheduler.helpers import (
    Pipeline,
    create_pod,
    extender_annotations,
    gpu_pod,
    pods_of,
    wait_running,
    wait_unschedulable,
    wait_webhook_sees,
    workload_template,
)
from webhook.decision import claims

OPTED_OUT = {"gpushare-webhook.io/injection": "disabled"}  # the webhook configuration skips it
GIB = dra.GIB


@pytest.fixture(scope="module")
def gpu_class(api: client.ApiClient) -> Iterator[str]:
    """The driver's DeviceClass for whole GPUs, as its chart installs it (no extended resource)."""
    dra.device_class(api)
    yield dra.DRIVER
    dra.delete_device_class(api, dra.DRIVER)


def claimed_pod(name: str, claim: str, node: str) -> dict[str, Any]:
    """A pod of one container using ResourceClaim ``claim``, kept to ``node``."""
    main = container("main", resources={"claims": [{"name": "gpu"}]})
    return pod(
        main,
        name=name,
        namespace=None,
        resourceClaims=[{"name": "gpu", "resourceClaimName": claim}],
        nodeSelector={"kubernetes.io/hostname": node},
    )


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_explicit_claims_pack_one_gpu_by_bytes_and_one_too_large_waits(
    scheduler: Any,
    api: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., dict[str, Any]],
    gpu_class: str,
) -> None:
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": OPTED_OUT}})
    node = f"dra-one-{namespace}"
    gpu_node(node, gpus=0)
    dra.publish_gpus(api, node, gpus=1, memory_gib=16)
    try:
        for index in range(4):
            dra.create_claim(api, namespace, f"quarter-{index}", "4Gi")
            create_pod(api, namespace, claimed_pod(f"quarter-{index}", f"quarter-{index}", node))
        dra.create_claim(api, namespace, "too-large", "20Gi")
        create_pod(api, namespace, claimed_pod("too-large", "too-large", node))
        # Two devices of one request are two GPUs: never the one GPU twice, room or not.
        dra.create_claim(api, namespace, "two", "1Gi", count=2)
        create_pod(api, namespace, claimed_pod("two", "two", node))

        claims = {}
        for index in range(4):
            assert wait_running(api, namespace, f"quarter-{index}")["spec"]["nodeName"] == node
            stored = dra.claim(api, namespace, f"quarter-{index}")
            assert stored is not None
            (result,) = dra.results(stored)
            assert (result["pool"], result["device"]) == (node, "gpu-0")
            assert result["consumedCapacity"] == {"memory": "4Gi"}
            assert result.get("shareID")
            claims[index] = stored
        assert dra.consumed(claims.values()) == {(node, "gpu-0"): 16 * GIB}

        for name in ("too-large", "two"):
            message = wait_unschedulable(api, namespace, name)
            assert "cannot allocate all claims" in message, message
        too_large = dra.claim(api, namespace, "too-large")
        assert too_large is not None
        assert not dra.results(too_large)
    finally:
        dra.unpublish(api, node)


# -- through the whole pipeline: the webhook serving scheduler: dra --

DRA = "scheduler: dra\n"
EXTENDER_KIND = "{}\n"  # every key its default: scheduler gpushare-extender
CLAIM = "gpushare-main"  # the pod's claim for its container "main"
LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
POOL_GIB = 24  # larger than the device plugin's GPUs: the webhook must size pods from the slices


@dataclass(frozen=True)
class DraNodes:
    """The module's fake nodes: ``pool`` (4 GPUs of 24 GiB published by the driver), ``card``
    (one such GPU, for the tests that fill it) and ``plugin`` (2 GPUs of 16 GiB behind the
    GPU-share device plugin and the extender, no driver)."""

    pool: str
    card: str
    plugin: str

    @property
    def dra(self) -> set[str]:
        return {self.pool, self.card}


@pytest.fixture(scope="module")
def nodes(api: client.ApiClient, gpu_class: str) -> Iterator[DraNodes]:
    """The module's nodes (DraNodes), made at once and waited for together; names never used
    before, since the extender keeps a node's GPUs from the first time it sees its name."""
    tag = int(time.time()) % 100000
    made = DraNodes(f"dra-pool-{tag}", f"dra-card-{tag}", f"plugin-{tag}")
    try:
        for name in made.dra:
            put_gpu_node(api, name, gpus=0, wait=False)
        put_gpu_node(api, made.plugin, gpus=2, memory=16, wait=False)
        dra.publish_gpus(api, made.pool, gpus=4, memory_gib=POOL_GIB)
        dra.publish_gpus(api, made.card, gpus=1, memory_gib=16)
        for name in (*made.dra, made.plugin):
            eventually(lambda name=name: node_ready(api, name, schedulable=True), timeout=60)
        yield made
    finally:
        core = client.CoreV1Api(api)
        for name in (*made.dra, made.plugin):
            dra.unpublish(api, name)
            with contextlib.suppress(ApiException):
                core.delete_node(name)


@pytest.fixture
def on_pool(pipeline: Pipeline, nodes: DraNodes) -> Iterator[Pipeline]:
    """The pipeline with the module's nodes; after the test, its pods deleted and their claims
    gone, so the next test finds the GPUs free."""
    yield pipeline
    free(pipeline)


@pytest.fixture
def on_dra(on_pool: Pipeline) -> Pipeline:
    """``on_pool`` with the webhook serving ``scheduler: dra``."""
    on_pool.policy(DRA)
    return on_pool


def free(pipeline: Pipeline) -> None:
    """Delete the namespace's pods; wait until the resourceclaim controller has deleted their
    claims (kube-scheduler then counts their bytes free)."""
    core = client.CoreV1Api(pipeline.api)
    core.delete_collection_namespaced_pod(pipeline.namespace, grace_period_seconds=0)
    eventually(lambda: not dra.list_claims(pipeline.api, pipeline.namespace), timeout=30)


def gib(size: str | int) -> int:
    return int(size) * GIB


def held(pipeline: Pipeline, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Running pod and its one allocation result (of its container's claim)."""
    pod = wait_running(pipeline.api, pipeline.namespace, name)
    found = dra.claims_of(pipeline.api, pod)
    assert set(found) == {CLAIM}, found
    (result,) = dra.results(found[CLAIM])
    return pod, result


def template_names(pipeline: Pipeline) -> set[str]:
    return {t["metadata"]["name"] for t in dra.list_templates(pipeline.api, pipeline.namespace)}


def limits_of(pod: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each container's shim limits (``CUDA_DEVICE_MEMORY_LIMIT`` and ``_<i>``) as written."""
    found = {}
    for each in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        env = {e["name"]: e.get("value") for e in each.get("env") or []}
        mine = {k: v for k, v in env.items() if k == LIMIT or k.startswith(f"{LIMIT}_")}
        if mine:
            found[each["name"]] = mine
    return found


def check_held(pod: dict[str, Any], result: dict[str, Any]) -> int:
    """The pod is set up for DRA (its label, its claim, no extended resource left) and its
    container's shim limit is the bytes its claim holds on its device. Those bytes."""
    name = pod["metadata"]["name"]
    assert pod["metadata"]["labels"][claims.DRA_LABEL] == "true"
    # No aliyun.com/gpu-mem left: the extender, which manages only that, never saw the pod.
    assert not extender_annotations(pod), name
    (main,) = pod["spec"]["containers"]
    assert main["resources"].get("claims") == [{"name": CLAIM}], main["resources"]
    assert GPU not in main["resources"].get("limits", {})
    memory = dra.quantity_bytes(result["consumedCapacity"]["memory"])
    mib = f"{memory // dra.MIB}m"
    assert limits_of(pod) == {"main": {LIMIT: mib, f"{LIMIT}_0": mib}}, name
    return memory


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_legacy_pods_share_gpus_by_bytes_and_each_limit_is_what_its_claim_holds(
    on_dra: Pipeline, nodes: DraNodes
) -> None:
    sizes = {"a": "4", "b": "4", "c": "8", "d": "2", "e": "6", "f": "3"}
    for name, size in sizes.items():
        on_dra.create(gpu_pod(name, size, nodeSelector={"kubernetes.io/hostname": nodes.pool}))

    by_device: dict[tuple[str, str], int] = {}
    for name, size in sizes.items():
        pod, result = held(on_dra, name)
        assert pod["spec"]["nodeName"] == nodes.pool
        assert (result["driver"], result["pool"]) == (dra.DRIVER, nodes.pool)
        assert check_held(pod, result) == gib(size)
        key = (result["pool"], result["device"])
        by_device[key] = by_device.get(key, 0) + gib(size)
    # Several pods on one GPU, each holding its bytes; no GPU holds more than it has.
    assert len(by_device) < len(sizes), by_device
    assert all(used <= gib(POOL_GIB) for used in by_device.values()), by_device
    assert sum(by_device.values()) == gib(27)
    claims_now = dra.list_claims(on_dra.api, on_dra.namespace)
    assert dra.consumed(claims_now) == by_device
    assert template_names(on_dra) == {
        f"gpushare-{int(size) * 1024}mi.gpu.nvidia.com" for size in sizes.values()
    }


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_the_last_gib_of_a_card_is_held_and_one_more_waits(
    on_dra: Pipeline, nodes: DraNodes
) -> None:
    card = {"nodeSelector": {"kubernetes.io/hostname": nodes.card}}
    on_dra.create(gpu_pod("most", "15", **card))
    on_dra.create(gpu_pod("last", "1", **card))
    held_bytes = 0
    for name in ("most", "last"):
        pod, result = held(on_dra, name)
        assert (result["pool"], result["device"]) == (nodes.card, "gpu-0")
        held_bytes += check_held(pod, result)
    assert held_bytes == gib(16)

    on_dra.create(gpu_pod("over", "1", **card))
    message = on_dra.pending("over")
    assert "cannot allocate all claims" in message, message


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_a_pod_is_sized_against_the_published_gpus_and_one_larger_than_all_refused(
    on_dra: Pipeline, nodes: DraNodes
) -> None:
    # The device plugin's GPUs are of 16 GiB, the driver's of 24: under dra the slices count.
    wait_webhook_sees(on_dra.installed, largest_gib=POOL_GIB)
    on_dra.create(gpu_pod("large", "20"))
    pod, result = held(on_dra, "large")
    assert (pod["spec"]["nodeName"], result["pool"]) == (nodes.pool, nodes.pool)
    assert check_held(pod, result) == gib(20)

    message, reasons = on_dra.refused(gpu_pod("huge", "25"))
    assert "24" in message, message
    assert reasons == ["exceeds-gpu"], (reasons, message)


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_in_a_mixed_cluster_the_scheduler_kind_picks_the_pool(
    on_pool: Pipeline, nodes: DraNodes
) -> None:
    pipeline = on_pool
    pipeline.policy(DRA)
    for index in range(3):
        pipeline.create(gpu_pod(f"dra-{index}", "4"))
    for index in range(3):
        pod, result = held(pipeline, f"dra-{index}")
        assert pod["spec"]["nodeName"] in nodes.dra
        assert result["pool"] == pod["spec"]["nodeName"]
        check_held(pod, result)

    pipeline.policy(EXTENDER_KIND)
    for index in range(3):
        pipeline.create(gpu_pod(f"plugin-{index}", "4"))
    for index in range(3):
        pod = pipeline.placed(f"plugin-{index}")
        assert pod["spec"]["nodeName"] == nodes.plugin
        assert not pod["spec"].get("resourceClaims")
        assert claims.DRA_LABEL not in (pod["metadata"].get("labels") or {})


def create_warned(pipeline: Pipeline, body: dict[str, Any]) -> list[str]:
    """Create the pod; the API server's warnings to the client (the webhook's among them)."""
    raw = client.CoreV1Api(pipeline.api).create_namespaced_pod(
        pipeline.namespace, body, _preload_content=False
    )
    return [value for key, value in raw.headers.items() if key.lower() == "warning"]


def wait_webhook_maps(installed: Installed, classes: int) -> None:
    """Until the webhook's node watch has seen ``classes`` DeviceClasses mapping gpu-mem."""
    name = "gpushare_deviceclasses_mapping_gpu_resources"
    # One worker: a scrape reads the snapshot it follows.
    eventually(lambda: installed.server.metrics().get(name) == classes, timeout=30)


MAPPING = "gpushare-mapped.gpu.nvidia.com"  # a DeviceClass mapping aliyun.com/gpu-mem (KEP-5004)


@pytest.fixture
def mapped(api: client.ApiClient) -> Iterator[str]:
    dra.device_class(api, MAPPING, extended_resource_name=GPU)
    yield MAPPING
    dra.delete_device_class(api, MAPPING)


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_with_gpu_mem_mapped_to_a_device_class_extender_pods_are_warned_dra_pods_hold_bytes(
    on_pool: Pipeline, nodes: DraNodes, mapped: str
) -> None:
    pipeline = on_pool
    pipeline.policy(EXTENDER_KIND)
    wait_webhook_maps(pipeline.installed, 1)
    warnings = create_warned(pipeline, gpu_pod("warned", "4"))
    assert any(mapped in warning for warning in warnings), warnings

    pipeline.policy(DRA)
    wait_webhook_maps(pipeline.installed, 1)
    warnings = create_warned(
        pipeline, gpu_pod("bytes", "4", nodeSelector={"kubernetes.io/hostname": nodes.pool})
    )
    assert not any(mapped in warning for warning in warnings), warnings
    pod, result = held(pipeline, "bytes")
    assert check_held(pod, result) == gib(4)
    assert not pod["status"].get("extendedResourceClaimStatus")


@pytest.mark.parametrize("configuration", [NO_EXTENDER])
def test_with_gpu_mem_mapped_kube_scheduler_alone_gives_a_pod_whole_gpus(
    scheduler: Any,
    api: client.ApiClient,
    namespace: str,
    nodes: DraNodes,
    mapped: str,
) -> None:
    # What the webhook keeps pods from under every kind: without it (this namespace opts out)
    # a pod asking 2 GiB of aliyun.com/gpu-mem, on a node that publishes GPUs and no
    # aliyun.com/gpu-mem, gets a claim of 2 devices, each taking its whole memory (the request
    # policy's default), since KEP-5004's claims ask a count and no capacity.
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": OPTED_OUT}})
    body = gpu_pod("counted", "2", nodeSelector={"kubernetes.io/hostname": nodes.pool})
    create_pod(api, namespace, body)
    pod = wait_running(api, namespace, "counted")
    found = dra.claims_of(api, pod)
    assert set(found) == {""}, found
    special = found[""]
    assert special["metadata"]["annotations"][dra.EXTENDED_CLAIM] == "true"
    taken = dra.results(special)
    assert len(taken) == 2
    assert {r["consumedCapacity"]["memory"] for r in taken} == {f"{POOL_GIB}Gi"}


def owned_by(pipeline: Pipeline, uids: set[str]) -> list[str]:
    """The namespace's claims owned by one of the pods ``uids``."""
    return [
        each["metadata"]["name"]
        for each in dra.list_claims(pipeline.api, pipeline.namespace)
        if {o["uid"] for o in each["metadata"].get("ownerReferences") or []} & uids
    ]


def claim_of(pipeline: Pipeline, pod: dict[str, Any]) -> str:
    """The name of the ResourceClaim the resourceclaim controller made for the pod's container."""
    return dra.claim_names(pod)[CLAIM]


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_a_deployments_and_a_jobs_pods_all_get_claims_from_one_template_per_size(
    on_dra: Pipeline, nodes: DraNodes
) -> None:
    apps, batch = client.AppsV1Api(on_dra.api), client.BatchV1Api(on_dra.api)
    pool = {"nodeSelector": {"kubernetes.io/hostname": nodes.pool}}
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serving"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "serving"}},
                 "template": workload_template("serving", "3", **pool)},
    }  # fmt: skip
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"backoffLimit": 0, "completions": 2, "parallelism": 2,
                 "template": workload_template("train", "5", restartPolicy="Never", **pool)},
    }  # fmt: skip
    apps.create_namespaced_deployment(on_dra.namespace, deployment)
    batch.create_namespaced_job(on_dra.namespace, job)
    try:

        def serving() -> bool:
            pods = pods_of(on_dra, "serving")
            return len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods)

        eventually(serving, timeout=60)
        for each in pods_of(on_dra, "serving"):
            _, result = held(on_dra, each["metadata"]["name"])
            assert check_held(each, result) == gib(3)

        # KWOK runs each of the Job's pods, then ends it (its pod-complete stage); each held its
        # claim while it ran, and once it has ended the resourceclaim controller deletes the claim.
        def trained() -> bool:
            return batch.read_namespaced_job("train", on_dra.namespace).status.succeeded == 2

        eventually(trained, timeout=60)
        ended = pods_of(on_dra, "train")
        assert len(ended) == 2
        for each in ended:
            assert each["status"]["phase"] == "Succeeded"
            assert limits_of(each) == {"main": {LIMIT: "5120m", f"{LIMIT}_0": "5120m"}}
        # The controller may make an ended pod's claim once more, unallocated, and delete it
        # again: what counts is that none is left, and no bytes held for an ended pod.
        ended_uids = {each["metadata"]["uid"] for each in ended}
        eventually(lambda: not owned_by(on_dra, ended_uids), timeout=30)

        # One template per size in the namespace, whatever the number of pods.
        assert template_names(on_dra) == {
            "gpushare-3072mi.gpu.nvidia.com",
            "gpushare-5120mi.gpu.nvidia.com",
        }
        left = dra.list_claims(on_dra.api, on_dra.namespace)
        assert len(left) == 3
        assert sum(dra.consumed(left).values()) == gib(9)
    finally:
        gone = client.V1DeleteOptions(propagation_policy="Foreground", grace_period_seconds=0)
        apps.delete_namespaced_deployment("serving", on_dra.namespace, body=gone)
        batch.delete_namespaced_job("train", on_dra.namespace, body=gone)
        eventually(lambda: not apps.list_namespaced_deployment(on_dra.namespace).items, 30)


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_a_pods_claim_is_deleted_with_it_and_its_bytes_are_free_again(
    on_dra: Pipeline, nodes: DraNodes
) -> None:
    card = {"nodeSelector": {"kubernetes.io/hostname": nodes.card}}
    on_dra.create(gpu_pod("first", "16", **card))
    pod, result = held(on_dra, "first")
    name = claim_of(on_dra, pod)
    stored = dra.claim(on_dra.api, on_dra.namespace, name)
    assert stored is not None
    (owner,) = stored["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Pod", "first", True)

    on_dra.create(gpu_pod("second", "16", **card))
    on_dra.pending("second")
    client.CoreV1Api(on_dra.api).delete_namespaced_pod("first", on_dra.namespace)
    # KWOK plays the kubelet: the pod goes, and its claim after it; the card is free again.
    eventually(lambda: dra.claim(on_dra.api, on_dra.namespace, name) is None, timeout=30)
    pod, result = held(on_dra, "second")
    assert (result["pool"], result["device"]) == (nodes.card, "gpu-0")
    assert check_held(pod, result) == gib(16)


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_each_container_of_a_pod_has_its_own_claim_and_a_limit_of_what_it_holds(
    on_dra: Pipeline, nodes: DraNodes
) -> None:
    body = pod(
        container("main", "4"),
        container("side", "6"),
        init=[container("warm", "2")],
        name="several",
        namespace=None,
        nodeSelector={"kubernetes.io/hostname": nodes.pool},
    )
    on_dra.create(body)
    stored = wait_running(on_dra.api, on_dra.namespace, "several")
    found = dra.wait_allocated(on_dra.api, on_dra.namespace, "several", claims=3)
    asked = {"warm": gib(2), "main": gib(4), "side": gib(6)}
    assert set(found) == {f"gpushare-{name}" for name in asked}
    limits = limits_of(stored)
    for name, size in asked.items():
        (result,) = dra.results(found[f"gpushare-{name}"])
        assert result["pool"] == nodes.pool
        assert dra.quantity_bytes(result["consumedCapacity"]["memory"]) == size
        mib = f"{size // dra.MIB}m"
        assert limits[name] == {LIMIT: mib, f"{LIMIT}_0": mib}, (name, limits)


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_a_two_gpu_pod_holds_its_memory_on_two_gpus_never_twice_on_one(
    on_dra: Pipeline, nodes: DraNodes
) -> None:
    # gpu-count 2 as a label (the policy's default): 8 GiB in all, 4 on each of two GPUs.
    pair, one_card = (
        gpu_pod(name, "8", nodeSelector={"kubernetes.io/hostname": node})
        for name, node in (("pair", nodes.pool), ("one-card", nodes.card))
    )
    for body in (pair, one_card):
        body["metadata"]["labels"] = {GPU_COUNT: "2"}
    on_dra.create(pair)
    stored = wait_running(on_dra.api, on_dra.namespace, "pair")
    (entry,) = stored["spec"]["resourceClaims"]
    assert entry["resourceClaimTemplateName"] == "gpushare-4096mi-x2.gpu.nvidia.com"
    taken = dra.results(dra.claims_of(on_dra.api, stored)[CLAIM])
    assert sorted(r["consumedCapacity"]["memory"] for r in taken) == ["4Gi", "4Gi"]
    assert len({(r["pool"], r["device"]) for r in taken}) == 2, taken
    four = f"{4 * 1024}m"
    assert limits_of(stored) == {"main": {LIMIT: four, f"{LIMIT}_0": four, f"{LIMIT}_1": four}}
    # Where the pod's node selector allows only a node of one GPU, the webhook counts the
    # published GPUs: kube-scheduler would not put both halves on one (the first test).
    message, reasons = on_dra.refused(one_card)
    assert reasons == ["too-many-gpus"], message
