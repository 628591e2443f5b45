"""``top`` for GPU memory: per node, per GPU, per pod, reserved, admitted and used.

Reserved is what the GPU Share Scheduler Extender wrote at bind
(``reserved``: ``ALIYUN_COM_GPU_MEM_IDX``/``ALIYUN_COM_GPU_MEM_POD``, in the
policy's unit); the limit is what the scheduler in use holds for a pod the
webhook set up (one with its status annotation), over all of its GPUs, from
the pod's model (``webhook.decision.model``), as ``report`` and the admission
metric count it; used is what the node agents report from the shim's
regions now, over the pod's containers and GPUs. Under ``scheduler: dra``
reserved is what the pod's ResourceClaims hold (``consumedCapacity``,
``webhook.report.claims``), and each device they hold shares of is a row
of its own, named driver/pool/device; a pod over several devices adds its
use to none of them (the shim's regions do not say which device is
which). Pure: the pods, the policy, the claims and each node's agent
report in, rows out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.decision import BYTES_PER_MIB, Policy, stored_gpu_pod
from webhook.node.scraped import Used
from webhook.node.usage import pod_of
from webhook.report.claims import NO_CLAIMS, Claims
from webhook.report.objects import FINISHED
from webhook.report.reserved import INDEX, RESERVED, annotated


@dataclass(frozen=True)
class TopPod:
    node: str
    gpu: int | None  # None: bound without the extender's record
    namespace: str
    pod: str
    reserved_bytes: int | None
    limit_bytes: int | None  # held for it over its GPUs; None: the webhook never set it up
    used_bytes: int | None  # None: its node's agent was not reached, or reported no region
    tampered: bool
    devices: tuple[str, ...] = ()  # driver/pool/device of each share its DRA claims hold


@dataclass(frozen=True)
class TopGpu:
    node: str
    gpu: int | None
    reserved_bytes: int
    limit_bytes: int
    used_bytes: int
    pods: int
    device: str = ""  # driver/pool/device of a DRA device ("": a GPU the extender counts)


@dataclass(frozen=True)
class Top:
    pods: tuple[TopPod, ...]
    gpus: tuple[TopGpu, ...]
    unreached: tuple[str, ...]  # nodes with GPU pods whose agent did not answer: why, per node

    @property
    def clean(self) -> bool:
        return not self.unreached and not any(p.tampered for p in self.pods)


def _bound_gpu_pod(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    spec, status, meta = obj.get("spec"), obj.get("status"), obj.get("metadata")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    phase = status.get("phase") if isinstance(status, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not node or phase in FINISHED or not isinstance(annotations, Mapping):
        return None
    return str(node), annotations


def used_by_pod(reports: Mapping[str, list[Used] | str]) -> dict[tuple[str, str], int]:
    """GPU memory used per pod (namespace, name), over its containers and devices, from the
    nodes whose agents answered (``top``, and ``report``'s used column)."""
    used: dict[tuple[str, str], int] = {}
    for found in reports.values():
        for row in found if isinstance(found, list) else ():
            used[row.namespace, row.pod] = used.get((row.namespace, row.pod), 0) + row.used_bytes
    return used


def build_top(
    objects: Iterable[Mapping[str, Any]],
    policy: Policy,
    reports: Mapping[str, list[Used] | str],
    claims: Claims = NO_CLAIMS,
) -> Top:
    """``reports``: per node, what its agent reported, or why it could not be asked;
    ``claims``: what DRA's claims hold."""
    unit = policy.mib_per_unit * BYTES_PER_MIB
    used = used_by_pod(reports)
    tampered = {
        (row.namespace, row.pod)
        for found in reports.values()
        for row in (found if isinstance(found, list) else ())
        if row.tampered
    }
    pods: list[TopPod] = []
    for obj in objects:
        bound = _bound_gpu_pod(obj)
        pod = pod_of(obj)
        if bound is None or pod is None:
            continue
        node, annotations = bound
        gpu, reserved = annotated(annotations.get(INDEX)), annotated(annotations.get(RESERVED))
        if reserved is None and not pod.admitted:
            continue  # not a GPU pod as far as the extender or the webhook knows
        key = (pod.namespace, pod.name)
        held = claims.held_bytes(key)
        if held is not None:
            reserved, gpu, unit_of = held, None, 1
        else:
            unit_of = unit
        pods.append(
            TopPod(
                node=node,
                gpu=gpu,
                namespace=pod.namespace,
                pod=pod.name,
                reserved_bytes=None if reserved is None else max(reserved, 0) * unit_of,
                limit_bytes=stored_gpu_pod(obj, policy).held_per_pod_bytes
                if pod.admitted
                else None,
                used_bytes=used.get(key),
                tampered=key in tampered,
                devices=claims.devices_of(key),
            )
        )
    pods.sort(key=lambda p: (p.node, -1 if p.gpu is None else p.gpu, p.namespace, p.pod))
    nodes = {p.node for p in pods}
    unreached = tuple(
        f"{node}: {reports.get(node, 'no node agent runs there')}"
        for node in sorted(nodes)
        if not isinstance(reports.get(node), list)
    )
    return Top(tuple(pods), _gpus(pods) + _devices(pods, claims), unreached)


def _devices(pods: list[TopPod], claims: Claims) -> tuple[TopGpu, ...]:
    """A row per DRA device the listed pods' claims hold shares of."""
    shown = {(p.namespace, p.pod): p for p in pods if p.devices}
    rows = []
    for device in claims.devices:
        held = [h for h in device.held if (h.namespace, h.pod) in shown]
        if not held:
            continue
        members = {(h.namespace, h.pod) for h in held}
        alone = [shown[k] for k in members if shown[k].devices == (device.id,)]
        rows.append(
            TopGpu(
                node=device.node,
                gpu=None,
                reserved_bytes=sum(h.held_bytes for h in held),
                limit_bytes=sum(h.held_bytes for h in held),
                used_bytes=sum(p.used_bytes or 0 for p in alone),
                pods=len(members),
                device=device.id,
            )
        )
    return tuple(rows)


def _gpus(pods: list[TopPod]) -> tuple[TopGpu, ...]:
    gpus: dict[tuple[str, int | None], list[TopPod]] = {}
    for pod in pods:
        if not pod.devices:
            gpus.setdefault((pod.node, pod.gpu), []).append(pod)
    return tuple(
        TopGpu(
            node=node,
            gpu=gpu,
            reserved_bytes=sum(p.reserved_bytes or 0 for p in members),
            limit_bytes=sum(p.limit_bytes or 0 for p in members),
            used_bytes=sum(p.used_bytes or 0 for p in members),
            pods=len(members),
        )
        for (node, gpu), members in gpus.items()
    )


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value // BYTES_PER_MIB}Mi"


def as_table(top: Top) -> str:
    header = ("NODE", "GPU", "NAMESPACE", "POD", "RESERVED", "LIMIT", "USED", "USED/LIMIT")
    rows = [header]
    for p in top.pods:
        share = (
            f"{100 * p.used_bytes // p.limit_bytes}%"
            if p.used_bytes is not None and p.limit_bytes
            else "-"
        )
        rows.append(
            (
                p.node,
                ",".join(p.devices) or ("-" if p.gpu is None else str(p.gpu)),
                p.namespace,
                p.pod + (" (tampered)" if p.tampered else ""),
                _mib(p.reserved_bytes),
                _mib(p.limit_bytes),
                _mib(p.used_bytes),
                share,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines += [f"not reached: {why}" for why in top.unreached]
    return "\n".join(lines) + "\n"


def as_json(top: Top) -> dict[str, Any]:
    def pod(p: TopPod) -> dict[str, Any]:
        return {
            "node": p.node,
            "gpu": p.gpu,
            "namespace": p.namespace,
            "pod": p.pod,
            "reservedBytes": p.reserved_bytes,
            "limitBytes": p.limit_bytes,
            "usedBytes": p.used_bytes,
            "tampered": p.tampered,
            "devices": list(p.devices),
        }

    def gpu(g: TopGpu) -> dict[str, Any]:
        return {
            "node": g.node,
            "gpu": g.gpu,
            "reservedBytes": g.reserved_bytes,
            "limitBytes": g.limit_bytes,
            "usedBytes": g.used_bytes,
            "pods": g.pods,
            "device": g.device,
        }

    return {
        "pods": [pod(p) for p in top.pods],
        "gpus": [gpu(g) for g in top.gpus],
        "unreached": list(top.unreached),
    }
