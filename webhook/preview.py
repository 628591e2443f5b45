"""The offline preview: run the webhook's own decision over YAML documents.

Owns finding the pod inside a workload (a Pod, or the pod template of a
Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob) and
applying the decision to it, so ``gpushare-webhook mutate`` shows in CI
exactly what admission will do — one code path with the webhook, like
``istioctl kube-inject``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from webhook.decision.capacity import limits_for
from webhook.decision.plan import Decision, plan
from webhook.decision.policy import Policy

# Where each kind keeps its pod template (None: the object is the pod).
TEMPLATE_PATHS: dict[str, tuple[str, ...] | None] = {
    "Pod": None,
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
_BUILTIN_GROUPS = {"v1", "apps/v1", "batch/v1"}


@dataclass
class Preview:
    """The result for one document."""

    label: str
    document: Any
    decision: Decision | None = None
    patch: list[dict[str, Any]] = field(default_factory=list)  # JSON Patch ops, as JSON data
    notes: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> bool:
        return self.decision is not None and not self.decision.allowed


def describe(document: Any, index: int) -> str:
    if isinstance(document, Mapping):
        kind = document.get("kind") or "object"
        meta = document.get("metadata")
        name = meta.get("name") or meta.get("generateName") if isinstance(meta, Mapping) else None
        return f"document {index} ({kind}/{name or '<unnamed>'})"
    return f"document {index}"


def preview(document: Any, policy: Policy, *, index: int = 1, namespace: str = "") -> Preview:
    """What admission does to the pod of ``document``.

    ``namespace`` is where it will be created when its metadata names none
    (``kubectl apply -n``): the policy's namespace rules depend on it.
    """
    label = describe(document, index)
    if not isinstance(document, Mapping):
        return Preview(label, document)
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if kind not in TEMPLATE_PATHS or api_version not in _BUILTIN_GROUPS:
        result = Preview(label, document)
        if policy.resource_name in json.dumps(document, default=str):
            result.notes.append(
                f"{label} mentions {policy.resource_name} but is not a kind the preview "
                "knows; its pods will be checked when they are created"
            )
        return result
    path = TEMPLATE_PATHS[kind]
    pod: Any = document
    for key in path or ():
        pod = pod.get(key) if isinstance(pod, Mapping) else None
    if not isinstance(pod, Mapping):
        return Preview(
            label, document, notes=[f"{label} has no pod template at {'.'.join(path or ())}"]
        )
    meta = document.get("metadata")
    namespace = (meta.get("namespace") if isinstance(meta, Mapping) else None) or namespace
    spec = pod.get("spec")
    decision = plan(
        pod,
        policy,
        namespace=str(namespace or ""),
        limits=limits_for(spec if isinstance(spec, Mapping) else {}, policy, None),
    )
    result = Preview(label, document, decision)
    if decision.allowed and decision.ops:
        prefix = "".join(f"/{key}" for key in path or ())
        ops = [{**op, "path": prefix + op["path"]} for op in decision.patch]
        result.patch = ops
        result.document = jsonpatch.apply_patch(copy.deepcopy(document), ops)
    return result
