"""A GPU pod as its scheduler sees it: worked out once, read by every rule and reader.

Owns what a pod's GPU memory comes to under the scheduler kind in use:
which containers ask (their :class:`ContainerAsk`), how many GPUs the pod
spans, and what the scheduler holds for the pod on each of them. The
fit rules, the status annotation, the admission metrics and log line,
``report`` and ``top`` all take these figures from a :class:`GpuPod`, so a
scheduler that counts a pod differently is one change here.

What each scheduler kind holds on a GPU, from its own source or
documentation (docs/schedulers.md):

- the GPU Share Scheduler Extender: its app containers' limits added up
  (``GetGPUMemoryFromPodResource`` in its ``pkg/utils/pod.go``, which it
  also writes as the pod's ``ALIYUN_COM_GPU_MEM_POD``); init containers
  are never counted, so an init container asking more is refused by
  ``webhook.decision.fit``;
- ACK's scheduler: as kube-scheduler holds any resource, the larger of
  the app containers' sum and the largest init container (init containers
  run one at a time, before the app containers, which run together);
- DRA (``scheduler: dra``): every GPU container's own claim, init
  containers' included, each on a GPU of its own choosing and held until
  the pod is gone; on one GPU, at most the largest of them.

Quantities are in the policy's memory unit; a name ending in ``per_gpu``
is what one GPU holds, ``per_pod`` is over all of the pod's GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.decision.asks import ContainerAsk, collect_asks
from webhook.decision.capacity import bounds_from_policy
from webhook.decision.claims import claimed_asks, is_claimed
from webhook.decision.policy import Policy
from webhook.decision.quantities import BYTES_PER_MIB
from webhook.decision.rules import Problems

APP = "containers"  # the kind of an app container's ask; init containers are "initContainers"


@dataclass(frozen=True, slots=True)
class GpuPod:
    """What a pod asks of its GPUs and what its scheduler holds for it (the policy's unit)."""

    asks: tuple[ContainerAsk, ...]  # the containers that ask GPU memory, in pod order
    gpus: int  # GPUs the pod spans: the most any of its containers spans (0: none asks)
    app_per_gpu: int  # the app containers' memory on one GPU, added up
    largest_init_per_gpu: int  # the largest init container's memory on one GPU
    held_per_gpu: int  # what the scheduler holds for the pod on each GPU it picks
    held_per_pod: int  # what it holds over all of the pod's GPUs
    compute_asked: int  # the app containers' compute shares they asked for, in percent
    mib_per_unit: int  # MiB in one unit of the policy's memory

    @property
    def held_per_pod_bytes(self) -> int:
        return self.held_per_pod * self.mib_per_unit * BYTES_PER_MIB


def gpu_pod(asks: Sequence[ContainerAsk], policy: Policy) -> GpuPod:
    """The model of a pod whose GPU containers ask ``asks``, under ``policy``'s scheduler."""
    app_per_gpu = app_per_pod = init_per_gpu = init_per_pod = compute = gpus = 0
    for ask in asks:
        gpus = max(gpus, ask.gpus)
        if ask.kind == APP:
            app_per_gpu += ask.memory_per_gpu
            app_per_pod += ask.memory_per_gpu * ask.gpus
            # Only shares asked for count: a default (fixed, or rounded up in
            # proportion) is the operator's, and shares over 100 only time-slice.
            compute += ask.compute if ask.compute_asked and ask.compute else 0
        else:
            init_per_gpu = max(init_per_gpu, ask.memory_per_gpu)
            init_per_pod = max(init_per_pod, ask.memory_per_gpu * ask.gpus)
    if policy.placed_by.claims:
        held_per_gpu = max((ask.memory_per_gpu for ask in asks), default=0)
        held_per_pod = sum(ask.memory_per_gpu * ask.gpus for ask in asks)
    elif policy.placed_by.reserves_init:
        held_per_gpu, held_per_pod = max(app_per_gpu, init_per_gpu), max(app_per_pod, init_per_pod)
    else:
        held_per_gpu, held_per_pod = app_per_gpu, app_per_pod
    return GpuPod(
        asks=tuple(asks),
        gpus=gpus,
        app_per_gpu=app_per_gpu,
        largest_init_per_gpu=init_per_gpu,
        held_per_gpu=held_per_gpu,
        held_per_pod=held_per_pod,
        compute_asked=compute,
        mib_per_unit=policy.mib_per_unit,
    )


NO_GPU_POD = GpuPod((), 0, 0, 0, 0, 0, 0, 1)  # a pod the webhook sets up nothing for


def stored_gpu_pod(pod: Mapping[str, Any], policy: Policy) -> GpuPod:
    """The model of a pod as the cluster stores it (``report``, ``top``).

    Its asks are read as admission reads them; a container whose ask cannot
    be read (admission would have refused it) adds nothing.
    """
    spec = pod.get("spec")
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(spec, Mapping):
        return gpu_pod((), policy)
    if policy.placed_by.claims and is_claimed(pod):
        return gpu_pod(claimed_asks(spec, policy), policy)
    found: Problems = []
    asks = collect_asks(
        spec,
        policy,
        bounds_from_policy(policy),
        labels if isinstance(labels, Mapping) else {},
        found,
    )
    return gpu_pod(asks, policy)
