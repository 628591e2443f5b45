"""Judging what a cluster holds against the policy in force: pods, workloads, nodes.

Owns the rules of ``gpushare-webhook report``. A GPU pod is judged by the
webhook's own decision, run on the pod as the cluster stores it:

- *confined*: admission would change nothing, so it carries the scheduler,
  the shim and exactly the limits the policy gives;
- *drifted*: admission would still set it up, so it runs without the shim
  or limits, or with limits other than the policy's; what differs is named,
  with the likely cause;
- *would be refused*: it breaks a rule the policy enforces in its namespace;
- *warned*: it breaks a rule, in a namespace the policy only warns in;
- *excluded*: it is in a namespace the policy leaves alone.

A workload is judged by its pod templates, as the offline preview judges
them: its pods are set up when they are made (*ok*), or they would be
refused or warned. Each GPU node, and each of its GPUs, gets the GPU memory
the scheduler extender reserved there, for which pods, and what is left, as
``kubectl inspect gpushare`` shows it (``webhook.report.reserved``), the
pods that hold GPU memory there without a limit, and the GPU pods bound
there that the extender does not count; GPU pods that wait for a scheduler
nobody answers are named. Under ``scheduler: dra`` each device the
webhook's claims hold shares of gets its shares, and for which pods
(``webhook.report.claims``): a pod's row beside it names its devices and
what its claims hold, with what does not add up (a shim limit other than
its claim's share, a claim not allocated); the report's own findings name
a DeviceClass mapping the policy's resource (KEP-5004) and, under DRA, the
GPU pods still left to move to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import jsonpatch

from webhook.decision import (
    INIT_STEP,
    STATUS_ANNOTATION,
    ContainerAsk,
    Decision,
    Policy,
    Prepared,
    container_label,
    decide,
    facts_of,
    gpu_node,
    is_claimed,
    is_gpu_pod,
    stored_gpu_pod,
)
from webhook.preview import preview
from webhook.reasons import Reason
from webhook.report.claims import (
    Device,
    left_to_migrate,
    mapped_classes,
    missing_setup,
    read_claims,
)
from webhook.report.objects import Objects, container_env
from webhook.report.refused import Refused, refused
from webhook.report.reserved import Accounts, NodeGpus, Waiting, account, unanswered

PodStatus = Literal["confined", "drifted", "would-be-refused", "warned", "excluded"]
WorkloadStatus = Literal["ok", "would-be-refused", "warned", "excluded"]
NOT_CALLED = (
    "admitted without the webhook: it was not installed yet, not called for this pod (a "
    "namespace opted out, match conditions), or not answering under failurePolicy: Ignore"
)
OTHER_POLICY = "set up under another policy (or by an earlier release) than the one in force"
# What a pod the webhook set up breaks only when the policy moved the shim since.
OURS_MOVED = frozenset({Reason.RESERVED_VOLUME, Reason.SHIM_MOUNT})


@dataclass(frozen=True)
class PodFinding:
    namespace: str
    name: str
    node: str  # "" while not placed
    status: PodStatus
    held_per_pod: int  # what its scheduler holds for it over all of its GPUs (policy's unit)
    unlimited: bool  # a container asks GPU memory and has no limit for it
    findings: tuple[str, ...] = ()
    cause: str = ""
    gpu: int | None = None  # the GPU of its node the scheduler extender counts it on
    reserved: int = 0  # the GPU memory the extender reserved for it there
    used_bytes: int | None = None  # what the node agent measures it using; None: not measured
    devices: tuple[str, ...] = ()  # driver/pool/device of each share its DRA claims hold
    claimed_bytes: int | None = None  # what its DRA claims hold; None: it holds through none


@dataclass(frozen=True)
class WorkloadFinding:
    kind: str
    namespace: str
    name: str
    status: WorkloadStatus
    findings: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeUsage:
    """A GPU node as the scheduler extender accounts it, with what the report adds."""

    record: NodeGpus  # its GPUs, what is reserved on each and for whom, who is not counted
    pods: int  # GPU pods bound there, counted by the extender or not
    unlimited: tuple[str, ...]  # namespace/name of pods holding GPU memory without a limit

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def total(self) -> int:
        return self.record.capacity.total

    @property
    def used(self) -> int:
        return self.record.used

    @property
    def free(self) -> int:
        return self.record.free


@dataclass(frozen=True)
class Report:
    unit: str
    pods: tuple[PodFinding, ...]
    workloads: tuple[WorkloadFinding, ...]
    nodes: tuple[NodeUsage, ...]
    notes: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    unanswered: tuple[Waiting, ...] = ()  # GPU pods waiting for a scheduler nobody answers
    refused: tuple[Refused, ...] = ()  # controllers whose pods the guard refused
    devices: tuple[Device, ...] = ()  # DRA devices the webhook's claims hold shares of
    findings: tuple[str, ...] = ()  # of the cluster as a whole: DeviceClasses, pods to move

    @property
    def unaccounted(self) -> int:
        """GPU pods bound to a node whose GPU memory the scheduler extender does not count."""
        return sum(len(node.record.unaccounted) for node in self.nodes)

    @property
    def clean(self) -> bool:
        """Nothing drifted, nothing a policy in force would refuse (warned included), every
        bound GPU pod counted by the scheduler extender, no GPU pod left unanswered,
        no controller's pod refused by the guard, and no finding of the cluster's."""
        statuses = {p.status for p in self.pods} | {w.status for w in self.workloads}
        unplaced = self.unaccounted or self.unanswered
        return not statuses & {"drifted", "would-be-refused", "warned"} and not (
            unplaced or self.refused or self.findings
        )


def build_report(
    objects: Objects,
    policy: Policy,
    *,
    now: datetime,
    usage: Mapping[tuple[str, str], int] | None = None,
) -> Report:
    """The report of ``objects`` under ``policy``, at ``now`` (aware: how long pods waited).

    ``usage``: GPU memory used per pod (namespace, name) in bytes, as the node
    agents measure it; a pod they report nothing for, and every pod without
    it, is not measured.
    """
    facts = [facts_of(node) for node in objects.nodes]
    gpus = [found for found in (gpu_node(f, policy) for f in facts) if found is not None]
    prepared = Prepared(policy, gpus)
    accounts = account(objects.nodes, objects.pods, policy)
    pods = [
        _placed(p, accounts.placed, accounts.reserved, accounts.unaccounted)
        for pod in objects.pods
        if (p := judge_pod(pod, prepared))
    ]
    if usage is not None:
        pods = [dataclasses.replace(p, used_bytes=usage.get((p.namespace, p.name))) for p in pods]
    claims = read_claims(objects.pods, objects.claims, objects.slices, policy)
    if objects.claims_listed:
        pods = [
            dataclasses.replace(
                p,
                devices=claims.devices_of(key := (p.namespace, p.name)),
                claimed_bytes=claims.held_bytes(key),
                findings=(*p.findings, *claims.findings.get(key, ())),
            )
            for p in pods
        ]
    workloads = [w for item in objects.workloads if (w := judge_workload(item, prepared))]
    notes = _notes(objects, accounts, policy)
    counts: dict[str, int] = {}
    for status in [p.status for p in pods]:
        counts[status] = counts.get(status, 0) + 1
    return Report(
        unit=policy.memory_unit,
        pods=tuple(sorted(pods, key=lambda p: (p.namespace, p.name))),
        workloads=tuple(sorted(workloads, key=lambda w: (w.namespace, w.kind, w.name))),
        nodes=tuple(_usage(node, pods) for node in accounts.nodes),
        notes=tuple(notes),
        counts=counts,
        unanswered=unanswered(objects.pods, policy, now),
        refused=refused(objects.events),
        devices=claims.devices if objects.claims_listed else (),
        findings=(
            *mapped_classes(objects.classes, policy),
            *left_to_migrate(objects.pods, policy),
        ),
    )


def _notes(objects: Objects, accounts: Accounts, policy: Policy) -> list[str]:
    """What the report leaves out, and why."""
    notes = []
    if objects.finished:
        notes.append(f"{objects.finished} finished pods left out: they hold no GPU")
    if not objects.nodes:
        notes.append("no Node in the input: GPU sizes come from the policy's gpuMemory")
    for node in accounts.nodes:
        if not node.capacity.count:
            notes.append(
                f"node {node.name} reports {policy.resource_name} but no "
                f"{policy.multi_gpu.resource_name}: the scheduler extender sees no GPU there, "
                "and places nothing there"
            )
    if accounts.elsewhere:
        notes.append(
            f"{accounts.elsewhere} GPU pods bound to nodes the input does not hold as GPU "
            "nodes: not in the GPU figures"
        )
    if policy.placed_by.claims and not objects.claims_listed:
        notes.append(
            "no ResourceClaim in the input: what DRA holds for each pod is not shown (list "
            "resourceclaims.resource.k8s.io with the rest)"
        )
    return notes


def _placed(
    pod: PodFinding,
    placed: Mapping[tuple[str, str], int],
    reserved: Mapping[tuple[str, str], int],
    unaccounted: Mapping[tuple[str, str], str],
) -> PodFinding:
    """The finding with what the scheduler extender reserved for the pod, or why it did not."""
    key = (pod.namespace, pod.name)
    if key in placed:
        return dataclasses.replace(pod, gpu=placed[key], reserved=reserved[key])
    if key in unaccounted:
        return dataclasses.replace(pod, findings=(*pod.findings, unaccounted[key]))
    return pod


def judge_pod(pod: Mapping[str, Any], prepared: Prepared) -> PodFinding | None:
    """The finding for one stored pod; None for a pod that is no GPU pod and breaks no rule."""
    policy = prepared.policy
    meta = pod["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    raw = pod.get("spec")
    spec: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    node = str(spec.get("nodeName") or "")
    gpu_pod = is_gpu_pod(pod, policy)
    gpu = stored_gpu_pod(pod, policy)
    if namespace in policy.exclude_namespaces:
        held = gpu.held_per_pod
        excluded = gpu_pod or bool(gpu.asks)
        return PodFinding(namespace, name, node, "excluded", held, False) if excluded else None
    # The scheduler's binding sets nodeName on every placed pod; as created,
    # it had none (a pod created with one is judged as if it had not).
    created = {**pod, "spec": {k: v for k, v in spec.items() if k != "nodeName"}}
    if policy.shim.init_regions and not _has_init_step(spec):
        prepared = _without_init_step(prepared)  # set up before the step: held to the rest
    decision = decide(created, prepared, namespace=namespace, bounds=prepared.bounds(spec))
    if decision.outcome == "untouched" and gpu.asks and is_claimed(pod):
        # Its ask is a claim now, which admission reads as no ask: judged by its set-up.
        lacks = tuple(missing_setup(pod, gpu.asks, policy))
        cause = OTHER_POLICY if STATUS_ANNOTATION in (meta.get("annotations") or {}) else NOT_CALLED
        status: PodStatus = "drifted" if lacks else "confined"
        held = gpu.held_per_pod
        return PodFinding(namespace, name, node, status, held, False, lacks, cause * bool(lacks))
    if decision.outcome == "untouched":
        return None
    memory, unlimited = gpu.held_per_pod, _unlimited(spec, gpu.asks, policy)
    messages = tuple(problem.message for problem in decision.problems)
    annotations = meta.get("annotations") or {}
    if messages and STATUS_ANNOTATION in annotations and set(decision.reasons) <= OURS_MOVED:
        # The webhook set it up, and a shim layout changed since: its own
        # volume or mounts, where the policy no longer puts them, are what clash.
        return PodFinding(
            namespace, name, node, "drifted", memory, unlimited, messages, OTHER_POLICY
        )
    if decision.outcome in ("rejected", "warned"):
        status = "would-be-refused" if decision.outcome == "rejected" else "warned"
        return PodFinding(namespace, name, node, status, memory, unlimited, messages)
    if decision.outcome == "unchanged":
        return PodFinding(namespace, name, node, "confined", memory, unlimited)
    cause = OTHER_POLICY if STATUS_ANNOTATION in annotations else NOT_CALLED
    found = _differences(created, decision, policy)
    return PodFinding(namespace, name, node, "drifted", memory, unlimited, found, cause)


def _has_init_step(spec: Mapping[str, Any]) -> bool:
    inits = spec.get("initContainers")
    first = inits[0] if isinstance(inits, list) and inits else None
    return isinstance(first, dict) and first.get("name") == INIT_STEP


def _without_init_step(prepared: Prepared) -> Prepared:
    """The policy less ``shim.initRegions``, for a pod set up before the step.

    It lacks only the step and the fallback mounts, and is confined as
    tightly as before by the rest (docs/security.md, "A cleared environment").
    """
    policy = prepared.policy
    return prepared.remember(
        (_without_init_step,),
        lambda: Prepared(
            dataclasses.replace(policy, shim=dataclasses.replace(policy.shim, init_regions=False)),
            prepared.nodes,
            prepared.note,
            uncounted=prepared.uncounted,
        ),
    )


def _unlimited(spec: Mapping[str, Any], asks: Iterable[ContainerAsk], policy: Policy) -> bool:
    """Whether a container that asks GPU memory has no limit for it."""
    return any(
        policy.env.memory_limit not in container_env(spec[ask.kind][ask.position]) for ask in asks
    )


def _differences(pod: Mapping[str, Any], decision: Decision, policy: Policy) -> tuple[str, ...]:
    """What the stored pod lacks, or has otherwise, against what admission would make of it."""
    expected = jsonpatch.apply_patch(pod, list(decision.patch))
    spec, want = pod["spec"], expected["spec"]
    found = []
    if spec.get("schedulerName") != want.get("schedulerName"):
        placed = spec.get("schedulerName") or "default-scheduler"
        found.append(f"placed by {placed}, not {want.get('schedulerName')}")
    volumes = {v.get("name") for v in spec.get("volumes") or () if isinstance(v, Mapping)}
    missing = [v["name"] for v in want.get("volumes") or () if v.get("name") not in volumes]
    if missing:
        found.append(f"no {', '.join(missing)} volume" + ("s" if len(missing) > 1 else ""))
    for ask in decision.asks:
        label = container_label(ask.kind, ask.name)
        have = container_env(spec[ask.kind][ask.position])
        should = container_env(want[ask.kind][ask.position])
        absent = [name for name in should if name not in have]
        if absent:
            found.append(f"{label}: no {', '.join(absent)}")
        for name, value in should.items():
            if name in have and have[name] != value:
                found.append(f"{label}: {name} is {have[name]!r}, the policy gives {value!r}")
        for name in have.keys() - should.keys():
            if name.startswith((policy.env.memory_limit, policy.env.sm_limit)):
                found.append(f"{label}: {name} would override the limit")
        mounts = {
            m.get("mountPath") for m in spec[ask.kind][ask.position].get("volumeMounts") or ()
        }
        for mount in want[ask.kind][ask.position].get("volumeMounts") or ():
            if mount.get("mountPath") not in mounts:
                found.append(f"{label}: nothing mounted at {mount['mountPath']}")
    if want.get("resourceClaims") != spec.get("resourceClaims"):
        found.append("not the ResourceClaims the policy gives: DRA holds none of its GPU memory")
    return tuple(found) or ("no status annotation",)


def judge_workload(item: Mapping[str, Any], prepared: Prepared) -> WorkloadFinding | None:
    """A workload's templates judged as its pods will be; None when none asks for a GPU."""
    policy = prepared.policy
    meta = item["metadata"]
    namespace, name, kind = str(meta["namespace"]), str(meta["name"]), str(item["kind"])
    excluded = namespace in policy.exclude_namespaces
    # Judged as if not excluded, to tell a GPU workload in an excluded namespace from others.
    if excluded:
        prepared = Prepared(dataclasses.replace(policy, exclude_namespaces=()), prepared.nodes)
    result = preview(item, prepared, namespace=namespace)
    judged = [(where, d) for where, d in result.decisions if d.outcome != "untouched"]
    if not judged:
        return None
    if excluded:
        return WorkloadFinding(kind, namespace, name, "excluded")
    several = len(result.decisions) > 1
    messages = tuple(
        f"{where}: {p.message}" if several else p.message
        for where, decision in judged
        for p in decision.problems
    )
    if any(not decision.allowed for _, decision in judged):
        return WorkloadFinding(kind, namespace, name, "would-be-refused", messages)
    if any(decision.outcome == "warned" for _, decision in judged):
        return WorkloadFinding(kind, namespace, name, "warned", messages)
    return WorkloadFinding(kind, namespace, name, "ok")


def _usage(node: NodeGpus, pods: list[PodFinding]) -> NodeUsage:
    counted = {(p.namespace, p.name) for gpu in node.gpus for p in gpu.pods}
    counted |= {(p.namespace, p.name) for p in node.unaccounted}
    here = [p for p in pods if p.node == node.name]
    return NodeUsage(
        record=node,
        pods=len(counted),
        unlimited=tuple(f"{p.namespace}/{p.name}" for p in here if p.unlimited),
    )
