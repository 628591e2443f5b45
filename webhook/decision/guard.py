"""The guard: a ValidatingAdmissionPolicy that refuses a GPU pod stored without its set-up.

Owns the policy and bindings the API server runs after every mutating
webhook: a pod that asks GPU memory and lacks what the webhook always
sets (the scheduler name, the shim's volumes and mounts, the shim first
in ``LD_PRELOAD``, the memory limit pinned to the container's own ask,
the accounting region, the status annotation) reached validation without
the webhook, and is refused (or warned about, where the webhook warns).
Under ``scheduler: dra`` a pod is held to the claims the webhook gave it
instead (``webhook.decision.guardclaims``).

The expressions are one fixed text; the webhook's policy reaches them
only as the ``params`` variables (literals), so the chart can make the
same object from its values (a test holds both equal to this module).
Data only: the caller encodes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from webhook.decision import contract, guardclaims
from webhook.decision.cel import CONTAINERS
from webhook.decision.cel import all_of as _all
from webhook.decision.cel import ask as _ask
from webhook.decision.cel import asks as _asks
from webhook.decision.cel import literal as _literal
from webhook.decision.cel import missing as _missing
from webhook.decision.contract import ACCOUNTING_VOLUME
from webhook.decision.fields import STATUS_ANNOTATION
from webhook.decision.layout import NO_OVERRIDE_VOLUME, PRELOAD, VOLUME_NAME
from webhook.decision.policy import LD_SO_PRELOAD, Policy

MESSAGE_PREFIX = "gpushare-webhook guard: "  # how every refusal begins, for whoever reads them
# Namespaces whose labels opt them out of the webhook (its configuration's selector).
OPT_OUT = {"key": "gpushare-webhook.io/injection", "operator": "NotIn", "values": ["disabled"]}


def params(policy: Policy) -> list[tuple[str, str | bool | int]]:
    """The policy's part of the guard: each variable the expressions read, and its value."""
    spans = policy.placed_by.spans_gpus
    return [
        ("resource", policy.resource_name),
        ("schedulerName", policy.scheduler_name),
        ("mibPerUnit", policy.mib_per_unit),
        ("hostPath", policy.shim.host_path),
        ("mountPath", policy.shim.mount_path),
        ("preload", policy.shim.preload),
        ("ldSoPreload", policy.shim.ld_so_preload),
        ("overrideFile", policy.shim.override_file),
        ("memoryLimit", policy.env.memory_limit),
        ("smLimit", policy.env.sm_limit),
        ("computeResource", policy.compute.resource_name),
        ("computeAlways", policy.compute.default != "none"),
        ("countResource", policy.multi_gpu.resource_name),
        ("countFromLabel", spans and policy.multi_gpu.count_from == "label"),
        ("countFromResource", spans and policy.multi_gpu.count_from == "resource"),
        ("perDevice", policy.multi_gpu.memory == "perDevice"),
        ("dra", policy.placed_by.claims),
        ("deviceClass", policy.dra.device_class),
        ("driverSetsLimits", policy.dra.driver_sets_limits),
    ]


# What follows, to the end of LOGIC, is text made once, at import, and pinned by
# tests/test_guard.py and tests/apiserver (docs/mutation.md).
# pragma: no mutate start
def _pinned(name: str, holds: str) -> str:
    """The variable is set, and every entry of it ``holds`` (a condition on ``e.value``).

    ``exists`` and ``all`` over the env, not a filtered list: no list is made for
    a pod that passes, which is every pod the webhook set up.
    """
    return (
        f"has(w.c.env) && w.c.env.exists(e, e.name == {name}) && "
        f"w.c.env.all(e, e.name != {name} || (has(e.value) && ({holds})))"
    )


def _mounted(volume: str, path: str) -> str:
    return (
        f"has(w.c.volumeMounts) && w.c.volumeMounts.exists(m, m.name == {_literal(volume)} && "
        f"m.mountPath == {path})"
    )


# Each GPU container (w.c) with the GPUs it gets, its memory per GPU as pinned
# ("4096m"), counted as the webhook counts them (webhook.decision.asks), and whether
# the shim limits its compute (w.sm). The API
# server types map literals strictly: dyn() lets one map hold a pod's container
# beside numbers and text.
_WANT = (
    "variables.gpu.map(c, {'c': dyn(c), 'gpus': dyn("
    f"variables.countFromResource && {_asks('variables.countResource')} ? "
    f"{_ask('variables.countResource')} : variables.podGpus)}})"
    ".map(w, {'c': w.c, 'gpus': w.gpus, 'mib': dyn(string("
    + _ask("variables.resource", "w.c")
    + " * variables.mibPerUnit / (variables.perDevice ? 1 : w.gpus)) + 'm'), 'sm': dyn("
    + f"variables.computeAlways || {_asks('variables.computeResource', 'w.c')})}})"
)
# A constant pattern, which the API server compiles once with the policy; one
# made from the variable's name would be compiled again for every entry of every pod.
_DEVICE = (
    "e.name.startsWith(variables.memoryLimit + '_') && "
    "e.name.substring(size(variables.memoryLimit) + 1).matches('^[0-9]+$')"
)
_PRELOAD_FIRST = (
    "e.value == variables.preload || e.value.startsWith(variables.preload + ':') || "
    "e.value.startsWith(variables.preload + ' ')"
)
# The container's accounting region (webhook.decision.contract.region_path).
_REGION = _literal(contract.REGION_DIR + "/") + " + w.c.name + '.cache'"

# What a GPU container must hold: (the condition on w, what is missing when it fails).
_PIECES = [
    (_mounted(VOLUME_NAME, "variables.mountPath"), "'the shim mounted at ' + variables.mountPath"),
    (
        f"!variables.ldSoPreload || {_mounted(VOLUME_NAME, _literal(LD_SO_PRELOAD))}",
        f"'the shim listed in {LD_SO_PRELOAD}'",
    ),
    (
        f"variables.overrideFile == '' || {_mounted(NO_OVERRIDE_VOLUME, 'variables.overrideFile')}",
        "'an empty file over ' + variables.overrideFile",
    ),
    (
        _mounted(ACCOUNTING_VOLUME, _literal(contract.REGION_DIR)),
        f"'the accounting volume at {contract.REGION_DIR}'",
    ),
    (_pinned(_literal(PRELOAD), _PRELOAD_FIRST), "'the shim first in LD_PRELOAD'"),
    (
        _pinned("variables.memoryLimit", "e.value == w.mib"),
        "variables.memoryLimit + '=' + w.mib",
    ),
    (
        f"has(w.c.env) && w.c.env.all(e, !({_DEVICE}) || (has(e.value) && e.value == w.mib)) && "
        "(w.gpus == 1 ? w.c.env.exists(e, e.name == variables.memoryLimit + '_0') : "
        f"size(w.c.env.filter(e, {_DEVICE})) >= w.gpus)",
        "variables.memoryLimit + '_0' + (w.gpus > 1 ? '.._' + string(w.gpus - 1) : '') + "
        "'=' + w.mib",
    ),
    (
        "!w.sm || (has(w.c.env) && w.c.env.exists(e, e.name == variables.smLimit))",
        "variables.smLimit",
    ),
    (
        _pinned(_literal(contract.REGION), f"e.value == {_REGION}"),
        f"'{contract.REGION}=' + {_REGION}",
    ),
]

# What the pod itself must hold: (the condition, what is missing when it fails).
_POD_PIECES = [
    (
        "object.spec.schedulerName == variables.schedulerName",
        "'schedulerName ' + variables.schedulerName",
    ),
    (
        f"has(object.metadata.annotations) && {_literal(STATUS_ANNOTATION)} in "
        "object.metadata.annotations",
        f"'the annotation {STATUS_ANNOTATION}'",
    ),
    (
        f"has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == "
        f"{_literal(VOLUME_NAME)} && has(v.hostPath) && v.hostPath.path == variables.hostPath)",
        f"'the volume {VOLUME_NAME} (hostPath ' + variables.hostPath + ')'",
    ),
    (
        f"has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == "
        f"{_literal(ACCOUNTING_VOLUME)} && has(v.emptyDir))",
        f"'the volume {ACCOUNTING_VOLUME} (emptyDir)'",
    ),
]


# The API server evaluates a variable only when an expression reads it. A pod
# the webhook set up is judged by ``ok`` alone, conditions joined by &&; the lists
# of what is missing, and their words, are made only for a pod that fails. Under
# scheduler: dra a pod is held by its claims instead (webhook.decision.guardclaims);
# under another scheduler a pod read for its claims alone asks nothing to hold.
LOGIC: list[tuple[str, str]] = [
    (
        "gpu",
        f"{CONTAINERS}.filter(c, " + _asks("variables.resource") + ")",
    ),
    (
        "podGpus",
        "variables.countFromLabel && has(object.metadata.labels) && "
        "variables.countResource in object.metadata.labels ? "
        "int(object.metadata.labels[variables.countResource]) : 1",
    ),
    ("want", _WANT),
    *guardclaims.logic(_PIECES, _POD_PIECES),
    (
        "ok",
        "variables.dra ? variables.draOk : size(variables.gpu) == 0 || "
        f"({_all(_POD_PIECES)} && variables.want.all(w, {_all(_PIECES)}))",
    ),
    (
        "lacks",
        f"variables.want.map(w, [w.c.name] + {_missing(_PIECES)}.filter(s, s != ''))"
        ".filter(l, size(l) > 1)"
        ".map(l, \"container '\" + l[0] + \"' lacks \" + l.slice(1, size(l)).join(', '))",
    ),
    ("podLacks", f"{_missing(_POD_PIECES)}.filter(s, s != '')"),
    (
        "problems",
        "variables.dra ? variables.draProblems : "
        "(size(variables.podLacks) > 0 ? ['the pod lacks ' + variables.podLacks.join(', ')] "
        ": []) + variables.lacks",
    ),
]


# pragma: no mutate end


# The pods the guard reads at all: a container asks the policy's resource, or the pod
# names a claim of the webhook's (scheduler: dra).
RESOURCE = "RESOURCE"  # stands for the resource's CEL literal in MATCH
MATCH = (
    f"object.spec.containers.exists(c, {_asks(RESOURCE)}) || (has(object.spec.initContainers) "
    f"&& object.spec.initContainers.exists(c, {_asks(RESOURCE)})) || {guardclaims.CLAIMED_MATCH}"
)


def why(webhook: str, namespace: str) -> str:
    """The end of every refusal: what likely happened, and where to look."""
    return (
        ": the pod reached the API server without gpushare-webhook's set-up (its webhook "
        "configuration deleted or edited, failurePolicy Ignore while it was down, or a later "
        f"webhook that undid it); check the MutatingWebhookConfiguration {webhook} and the "
        f"webhook's pods in {namespace}, then create the pod again"
    )


def validating_policy(
    policy: Policy, *, webhook: str, namespace: str, also_excluded: Sequence[str] = ()
) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy for ``policy``, its webhook ``webhook`` in ``namespace``."""
    variables = [{"name": n, "expression": _literal(v)} for n, v in params(policy)]
    variables += [{"name": n, "expression": e} for n, e in LOGIC]
    excluded = sorted({namespace, "kube-system", *policy.exclude_namespaces, *also_excluded})
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"{webhook}-guard"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                # The webhook's own exclusions, so the guard never refuses what it skips.
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": excluded,
                        },
                        OPT_OUT,
                    ]
                },
            },
            "matchConditions": [
                {
                    "name": "gpu-memory-pods",
                    "expression": MATCH.replace(RESOURCE, _literal(policy.resource_name)),
                }
            ],
            "variables": variables,
            "validations": [
                {
                    "expression": "variables.ok",
                    "messageExpression": f"{_literal(MESSAGE_PREFIX)} + "
                    f"variables.problems.join('; ') + {_literal(why(webhook, namespace))}",
                    "reason": "Forbidden",
                }
            ],
            # The audit log names the guard (its key is prefixed with the policy's name).
            "auditAnnotations": [
                {
                    "key": "refused",
                    # An empty value is left out of the audit event.
                    "valueExpression": "variables.ok ? '' : variables.problems.join('; ')",
                }
            ],
        },
    }


def bindings(policy: Policy, *, webhook: str) -> list[dict[str, Any]]:
    """Deny where the webhook refuses, Warn (and audit) where it only warns."""
    name = f"{webhook}-guard"
    warned = sorted(n for n, p in policy.namespaces.items if p.enforcement == "warn")
    enforced = sorted(n for n, p in policy.namespaces.items if p.enforcement == "enforce")
    deny, warn = (name, ["Deny"]), (f"{name}-warn", ["Warn", "Audit"])
    # The policy's own mode everywhere but the namespaces it names otherwise.
    usual, other, others = (
        (warn, deny, enforced)
        if policy.enforcement == "warn"
        else (
            deny,
            warn,
            warned,
        )
    )
    found = [_binding(name, *usual, "NotIn", others)]
    if others:
        found.append(_binding(name, *other, "In", others))
    return found


def _binding(
    policy_name: str, name: str, actions: list[str], operator: str, names: Sequence[str]
) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": policy_name, "validationActions": actions}
    if names:
        expression = {"key": "kubernetes.io/metadata.name", "operator": operator, "values": names}
        spec["matchResources"] = {"namespaceSelector": {"matchExpressions": [expression]}}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": spec,
    }


def guard(
    policy: Policy,
    *,
    webhook: str = "gpushare-webhook",
    namespace: str = "gpushare-system",
    also_excluded: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The guard's objects: the policy, then its bindings.

    ``webhook`` names the MutatingWebhookConfiguration (the guard is named
    after it), ``namespace`` is where it runs, and ``also_excluded`` the
    namespaces its configuration's selector leaves out besides the policy's.
    """
    return [
        validating_policy(
            policy, webhook=webhook, namespace=namespace, also_excluded=also_excluded
        ),
        *bindings(policy, webhook=webhook),
    ]
