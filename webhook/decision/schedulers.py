"""The schedulers a GPU pod's set-up must agree with, and what ``scheduler: dra`` needs.

Owns what each scheduler kind the policy can name holds for a pod and
reads of it (:class:`Scheduler`, ``SCHEDULERS``), each read from the
scheduler's own source or documentation (docs/schedulers.md), and the
policy's ``dra`` section (:class:`Dra`): the DeviceClass every claim asks
and the driver whose ResourceSlices publish the GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from webhook.decision.keys import Boolean, OrEmpty, String, setting

# A DeviceClass or driver name: a DNS subdomain.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A capacity name of a device: a C identifier-like name, as resource.k8s.io validates it.
_CAPACITY = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class Dra:
    """``scheduler: dra``: the DeviceClass each claim asks and the driver publishing the GPUs.

    The defaults are NVIDIA's driver (kubernetes-sigs/dra-driver-nvidia-gpu)
    with consumable shares on; HAMi's (Project-HAMi/k8s-dra-driver) is
    ``hami-core-gpu.project-hami.io`` with ``computeCapacity: cores``
    (docs/dra.md). Both publish ``memory`` in bytes, in steps of 1 MiB.
    """

    device_class: str = setting(
        "deviceClassName",
        "gpu.nvidia.com",
        String(_SUBDOMAIN, "a DeviceClass name such as gpu.nvidia.com"),
        "the DeviceClass every claim asks",
    )
    driver: str = setting(
        "driver",
        "gpu.nvidia.com",
        String(_SUBDOMAIN, "a DRA driver name such as gpu.nvidia.com"),
        "the driver whose ResourceSlices publish the GPUs",
    )
    memory_capacity: str = setting(
        "memoryCapacity",
        "memory",
        String(_CAPACITY, "a device capacity name such as memory"),
        "the device capacity holding GPU memory, in bytes",
    )
    # HAMi's driver publishes cores with a default of 100: a claim that asks none
    # holds the whole GPU's compute, so with it every claim names its share.
    compute_capacity: str = setting(
        "computeCapacity",
        "",
        OrEmpty(String(_CAPACITY, "a device capacity name such as cores")),
        'the capacity holding compute share in percent ("": none; HAMi\'s: cores)',
    )
    # HAMi's driver writes the shim's limits and preload itself, from what the
    # claim holds (its CDI edits); the webhook then sets only the claims.
    driver_sets_limits: bool = setting(
        "driverSetsLimits",
        False,
        Boolean(),
        "the driver sets the shim up from the claim: the webhook sets only claims",
    )


@dataclass(frozen=True)
class Scheduler:
    """What a GPU-share scheduler reserves and reads: the rules a pod's set-up must agree with.

    The scheduler decides where a pod runs and how much of a GPU is held
    for it there; a shim limit above what it holds would let a container
    take a neighbour's memory, and a form it does not read would leave the
    pod Pending or on fewer GPUs than its limits say.
    """

    title: str  # for messages: "the GPU Share Scheduler Extender"
    scheduler_name: str  # the schedulerName its install serves (the policy's default)
    spans_gpus: bool  # reads a pod's GPU count (ACK's label, or a container resource)
    reserves_init: bool  # holds the larger of the app containers' sum and the largest init
    countless_gpus: int  # GPUs of a node that reports memory but no count
    one_gpu_container: bool  # its device plugin hands the GPU to one container of a pod
    # Each GPU container holds a claim of its own (DRA), on a GPU of its own
    # choosing, for the pod's whole life: nothing is shared inside the pod.
    claims: bool = False


# Read from each scheduler's own source or documentation (docs/schedulers.md).
SCHEDULERS: dict[str, Scheduler] = {
    # github.com/AliyunContainerService/gpushare-scheduler-extender: its filter and bind
    # sum the app containers' limits only (pkg/utils/pod.go), place a pod on one GPU,
    # and give a node without aliyun.com/gpu-count no devices (pkg/cache/nodeinfo.go).
    # Its install guide adds it to the default profile of kube-scheduler.
    "gpushare-extender": Scheduler(
        title="the GPU Share Scheduler Extender",
        scheduler_name="default-scheduler",
        spans_gpus=False,
        reserves_init=False,
        countless_gpus=0,
        # Its device plugin (gpushare-device-plugin, pkg/gpu/nvidia/allocate.go) matches
        # one container's ask to a pod's sum, once per pod.
        one_gpu_container=True,
    ),
    # Alibaba Cloud ACK's managed scheduler, as its GPU-sharing documentation describes
    # it: the aliyun.com/gpu-count label spans GPUs of one node, a pod is held as
    # kube-scheduler holds any resource (init containers included), in the default profile.
    "ack": Scheduler(
        title="ACK's GPU-sharing scheduler",
        scheduler_name="default-scheduler",
        spans_gpus=True,
        reserves_init=True,
        countless_gpus=1,
        one_gpu_container=False,
    ),
    # kube-scheduler's Dynamic Resource Allocation with consumable capacity (KEP-5075):
    # the webhook turns each GPU container's ask into a ResourceClaim (webhook.decision.
    # claims); a claim is allocated whole, on one node, and held until the pod is gone,
    # init containers' included (pkg/controller/resourceclaim frees it with the pod).
    "dra": Scheduler(
        title="kube-scheduler's Dynamic Resource Allocation",
        scheduler_name="default-scheduler",
        spans_gpus=True,
        reserves_init=True,
        countless_gpus=0,
        one_gpu_container=False,
        claims=True,
    ),
}
