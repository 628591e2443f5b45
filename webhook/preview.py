"""The offline preview: run the webhook's own decision over YAML documents.

Owns finding the pods inside a document (a Pod, the pod template of a
built-in workload, including API versions clusters no longer serve, or the
pod templates of the training-job kinds in ``WORKLOADS``) and applying the
decision to each, so ``gpushare-webhook mutate`` shows in CI
exactly what admission will do — one code path with the webhook, like
``istioctl kube-inject``. Under ``scheduler: dra`` it also names each claim
a mutated pod references and the ResourceClaimTemplate it is made from,
the body the cluster side will create (``webhook.decision.claims``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from webhook.decision import Decision, Policy, Prepared, claim_template, decide

Path = tuple[str, ...]  # keys from the document to a pod template; "*" is every item
_TEMPLATE: Path = ("spec", "template")

# Where each kind keeps its pod templates, by API group and kind (a Pod is its own).
WORKLOADS: dict[tuple[str, str], tuple[Path, ...]] = {
    ("", "Pod"): ((),),
    ("", "ReplicationController"): (_TEMPLATE,),
    ("apps", "Deployment"): (_TEMPLATE,),
    ("apps", "StatefulSet"): (_TEMPLATE,),
    ("apps", "DaemonSet"): (_TEMPLATE,),
    ("apps", "ReplicaSet"): (_TEMPLATE,),
    ("batch", "Job"): (_TEMPLATE,),
    ("batch", "CronJob"): (("spec", "jobTemplate", "spec", "template"),),
    # Training jobs GPU users run (Kubeflow's training operator, JobSet,
    # LeaderWorkerSet, KubeRay); each replica group has its own template.
    ("kubeflow.org", "PyTorchJob"): (("spec", "pytorchReplicaSpecs", "*", "template"),),
    ("kubeflow.org", "TFJob"): (("spec", "tfReplicaSpecs", "*", "template"),),
    ("kubeflow.org", "MPIJob"): (("spec", "mpiReplicaSpecs", "*", "template"),),
    ("kubeflow.org", "XGBoostJob"): (("spec", "xgbReplicaSpecs", "*", "template"),),
    ("kubeflow.org", "PaddleJob"): (("spec", "paddleReplicaSpecs", "*", "template"),),
    ("jobset.x-k8s.io", "JobSet"): (("spec", "replicatedJobs", "*", "template", *_TEMPLATE),),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): (
        ("spec", "leaderWorkerTemplate", "leaderTemplate"),
        ("spec", "leaderWorkerTemplate", "workerTemplate"),
    ),
    ("ray.io", "RayCluster"): (
        ("spec", "headGroupSpec", "template"),
        ("spec", "workerGroupSpecs", "*", "template"),
    ),
    ("ray.io", "RayJob"): (
        ("spec", "rayClusterSpec", "headGroupSpec", "template"),
        ("spec", "rayClusterSpec", "workerGroupSpecs", "*", "template"),
    ),
    ("ray.io", "RayService"): (
        ("spec", "rayClusterConfig", "headGroupSpec", "template"),
        ("spec", "rayClusterConfig", "workerGroupSpecs", "*", "template"),
    ),
}
# API versions of the built-in groups that current clusters no longer serve,
# still common in published samples: previewed, with a note.
REMOVED = {
    "extensions/v1beta1": "1.16",
    "apps/v1beta1": "1.16",
    "apps/v1beta2": "1.16",
    "batch/v1beta1": "1.25",
    "batch/v2alpha1": "1.21",
}
_SERVED = {"": {"v1"}, "apps": {"v1"}, "batch": {"v1"}}
_OLD_GROUPS = {"extensions": "apps"}  # extensions/v1beta1 workloads live in apps now


def _group_kind(api_version: str, kind: str) -> tuple[str, str]:
    group = api_version.rpartition("/")[0]
    return _OLD_GROUPS.get(group, group), kind


def _templates(document: Mapping[str, Any], path: Path) -> list[tuple[Path, Any]]:
    """Each (concrete path, value) that ``path`` reaches, "*" taking every item."""
    found: list[tuple[Path, Any]] = [((), document)]
    for key in path:
        step: list[tuple[Path, Any]] = []
        for at, node in found:
            if key == "*" and isinstance(node, Mapping):
                step += [((*at, str(k)), v) for k, v in node.items()]
            elif key == "*" and isinstance(node, list):
                step += [((*at, str(i)), v) for i, v in enumerate(node)]
            elif isinstance(node, Mapping) and key in node:
                step.append(((*at, key), node[key]))
        found = step
    return found


def _pointer(path: Path) -> str:
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in path)


@dataclass
class Preview:
    """The result for one document: a decision for each of its pod templates."""

    label: str
    document: Any
    decisions: list[tuple[str, Decision]] = field(default_factory=list)  # (where, decision)
    patch: list[dict[str, Any]] = field(default_factory=list)  # JSON Patch ops, as JSON data
    notes: list[str] = field(default_factory=list)
    # Under scheduler: dra, each (where, claim, ResourceClaimTemplate) of the mutated pods.
    claims: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    @property
    def decision(self) -> Decision | None:
        """The first refusal, else the first template's decision (a Pod's own)."""
        ordered = sorted(self.decisions, key=lambda found: found[1].allowed)  # stable
        return ordered[0][1] if ordered else None

    @property
    def rejected(self) -> bool:
        return any(not decision.allowed for _, decision in self.decisions)


# How a document that is not a mapping is named to the person who wrote it.
_YAML_TYPES: dict[type, str] = {
    list: "list",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
}


def describe(document: Any, index: int) -> str:
    if isinstance(document, Mapping):
        kind = document.get("kind") or "object"
        meta = document.get("metadata")
        name = meta.get("name") or meta.get("generateName") if isinstance(meta, Mapping) else None
        return f"document {index} ({kind}/{name or '<unnamed>'})"
    return f"document {index}"


def preview(document: Any, prepared: Prepared, *, index: int = 1, namespace: str = "") -> Preview:
    """What admission does to the pods of ``document``.

    ``namespace`` is where it will be created when its metadata names none
    (``kubectl apply -n``): the policy's namespace rules depend on it.
    """
    label = describe(document, index)
    result = Preview(label, document)
    if not isinstance(document, Mapping):
        if document is not None:  # an empty document between two "---" is nothing to say
            result.notes.append(
                f"{label} is a YAML {_YAML_TYPES.get(type(document), 'value')}, not a "
                "Kubernetes object (a mapping with apiVersion and kind); left as it is"
            )
        return result
    paths = _workload_paths(document, result)
    if not paths:
        _note_unknown(document, prepared.policy.resource_name, result)
        return result
    templates = [found for path in paths for found in _templates(document, path)]
    if not templates:
        where = " or ".join(".".join(path) for path in paths)
        result.notes.append(f"{label} has no pod template at {where}")
        return result
    meta = document.get("metadata")
    namespace = (meta.get("namespace") if isinstance(meta, Mapping) else None) or namespace
    _plan_templates(result, templates, prepared, namespace=str(namespace or ""))
    return result


def _workload_paths(document: Mapping[str, Any], result: Preview) -> tuple[Path, ...] | None:
    """Where the document's kind keeps its pod templates; None for a kind not previewed.

    A removed API version of a built-in kind is previewed as the one served
    now, with a note on ``result``.
    """
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        return None
    group, kind = _group_kind(api_version, kind)
    paths = WORKLOADS.get((group, kind))
    if paths and api_version in REMOVED:
        result.notes.append(
            f"{result.label}: {api_version} was removed in Kubernetes {REMOVED[api_version]}; "
            f"previewed as {group or 'v1'}/v1 {kind}, which is what a cluster accepts now"
        )
    elif paths and group in _SERVED and api_version.rpartition("/")[2] not in _SERVED[group]:
        return None  # an API version of a built-in group that no cluster serves
    return paths


def _note_unknown(document: Mapping[str, Any], resource_name: str, result: Preview) -> None:
    """Say why a document that is not previewed goes unchecked, if it asks for the resource.

    Objects of other kinds that never mention the resource get no note: a
    stream of manifests holds Services, ConfigMaps and the like. A document
    with no apiVersion or kind is no object at all, so it always gets one.
    """
    mentions = resource_name in json.dumps(document, default=str)
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        missing = " and ".join(
            name
            for name, value in (("apiVersion", api_version), ("kind", kind))
            if not isinstance(value, str)
        )
        result.notes.append(
            f"{result.label} mentions {resource_name} but has no {missing}, so no cluster "
            "would take it: add it (apiVersion: v1 and kind: Pod, or apps/v1 and the "
            "workload's kind)"
            if mentions
            else f"{result.label} has no {missing}, so no cluster would take it; left as it is"
        )
    elif mentions:
        result.notes.append(
            f"{result.label} mentions {resource_name} but {api_version} {kind} is not a "
            "kind the preview knows; its pods will be checked when they are created"
        )


def _plan_templates(
    result: Preview, templates: list[tuple[Path, Any]], prepared: Prepared, *, namespace: str
) -> None:
    """Decide each pod template, and patch the document only when none is refused.

    A refused document is left out of ``mutate``'s output, so patching it
    would only cost the deep copy.
    """
    ops: list[dict[str, Any]] = []
    for at, pod in templates:
        if not isinstance(pod, Mapping):
            result.notes.append(f"{result.label}: {'.'.join(at)} is not a pod template")
            continue
        decision = decide(pod, prepared, namespace=namespace)
        result.decisions.append((".".join(at), decision))
        prefix = _pointer(at)
        ops += [{**op, "path": prefix + op["path"]} for op in decision.patch]
    if ops and not result.rejected:
        result.patch = ops
        result.document = jsonpatch.apply_patch(copy.deepcopy(result.document), ops)
        if prepared.policy.placed_by.claims:
            for at, _ in templates:
                result.claims += _claims(".".join(at), _at(result.document, at), prepared.policy)
        for _, _, body in result.claims:
            if namespace:
                body["metadata"]["namespace"] = namespace


def _at(document: Any, path: Path) -> Any:
    for key in path:
        document = document[int(key)] if isinstance(document, list) else document[key]
    return document


def _claims(where: str, pod: Any, policy: Policy) -> list[tuple[str, str, dict[str, Any]]]:
    """Each claim of ``pod`` made from one of the webhook's templates, with that template."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    found = []
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping):
            continue
        body = claim_template(str(entry.get("resourceClaimTemplateName") or ""), policy)
        if body is not None:
            found.append((where, str(entry.get("name")), body))
    return found


def claim_templates(results: list[Preview]) -> list[dict[str, Any]]:
    """The ResourceClaimTemplates the previewed pods reference, each once, in order named.

    The cluster makes one per namespace and name; a template named by two
    pods of one namespace is one object.
    """
    made: dict[tuple[str, str], dict[str, Any]] = {}
    for result in results:
        for _, _, body in result.claims:
            meta = body["metadata"]
            made.setdefault((meta.get("namespace", ""), meta["name"]), body)
    return list(made.values())
