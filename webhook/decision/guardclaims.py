"""The guard under ``scheduler: dra``: a pod held to the claims the webhook gave it.

Owns the guard's expressions for a pod whose GPU containers reference the
webhook's claims (``webhook.decision.claims``): the name of each claim's
template says its MiB per GPU, its GPUs, its compute share and its
DeviceClass, so the guard reads them from the pod alone and holds

- no container still asking the policy's extended resources: the webhook
  removes them, and kube-scheduler would serve one through a DeviceClass
  that maps it (KEP-5004) as whole GPUs, or place the pod nowhere;
- every claim's template of the policy's DeviceClass;
- each claiming container set up for the shim as a GPU container is, its
  memory limit the MiB its template names (under ``dra.driverSetsLimits``
  the driver sets the shim up: only the pod's scheduler and status).

A pod is one of these by its claims (named ``gpushare-*``, from a template
of the webhook's shape), not by the ``gpushare-webhook.io/dra`` label: the
claims are what the scheduler and the driver act on, and a label alone
asks for no GPU. Text only, made once at import (docs/mutation.md).
"""

from __future__ import annotations

from webhook.decision.cel import CONTAINERS, all_of, asks, missing
from webhook.decision.claims import PREFIX

# The template names claims.template_name gives (claims.template_shape reads them),
# in RE2 for CEL's matches(): MiB per GPU, GPUs, compute share, then the DeviceClass.
TEMPLATE_PATTERN = f"^{PREFIX}[0-9]+mi(-x[0-9]+)?(-c[0-9]+)?[.].+$"
# A pod the guard reads under dra although it asks no GPU resource: it names a claim
# of the webhook's (the claim's name only: matchConditions see no variables).
CLAIMED_MATCH = (
    "(has(object.spec.resourceClaims) && "
    f"object.spec.resourceClaims.exists(r, r.name.startsWith('{PREFIX}')))"
)


# pragma: no mutate start
# The head of a template's name, before its DeviceClass: gpushare-4096mi-x2-c30.
_HEAD = "w.t.substring(0, w.t.indexOf('.'))"
# Each claiming container (w.c), its template (w.t), and what the template names as
# the expressions for GPU containers read them (webhook.decision.guard): its GPUs,
# its MiB per GPU as pinned ("4096m"), and whether the shim limits its compute.
_WANT = (
    f"{CONTAINERS}.filter(c, has(c.resources) && has(c.resources.claims) && "
    "c.resources.claims.exists(r, variables.draClaims.exists(p, p.name == r.name)))"
    ".map(c, {'c': dyn(c), 't': dyn(variables.draClaims.filter(p, "
    "c.resources.claims.exists(r, r.name == p.name))[0].resourceClaimTemplateName)})"
    f".map(w, {{'c': w.c, 't': w.t, 'h': dyn({_HEAD})}})"
    ".map(w, {'c': w.c, 't': w.t, "
    "'gpus': dyn(w.h.contains('-x') ? int(w.h.split('-x')[1].split('-')[0]) : 1), "
    "'mib': dyn(string(int(w.h.split('-')[1].split('mi')[0])) + 'm'), "
    "'sm': dyn(variables.computeAlways || (w.h.contains('-c') && int(w.h.split('-c')[1]) > 0))})"
)
_RESOURCES = "[variables.resource, variables.computeResource, variables.countResource]"
_ASKED = (
    f"{CONTAINERS}.filter(c, {_RESOURCES}.exists(n, {asks('n')}))"
    f'.map(c, "container \'" + c.name + "\' asks " + {_RESOURCES}.filter(n, {asks("n")})'
    ".join(', ') + ', which the webhook turns into a ResourceClaim under scheduler: dra "
    "(kube-scheduler would give it whole GPUs through a DeviceClass that maps it, or no node)')"
)
_CLASS = "p.resourceClaimTemplateName.substring(p.resourceClaimTemplateName.indexOf('.') + 1)"
_CLASSES = (
    f"variables.draClaims.filter(p, {_CLASS} != variables.deviceClass)"
    '.map(p, "claim \'" + p.name + "\' is made from " + p.resourceClaimTemplateName + '
    "', of the DeviceClass ' + " + _CLASS + " + ', not ' + variables.deviceClass)"
)


def logic(
    pieces: list[tuple[str, str]], pod_pieces: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The dra variables, in order, as (name, expression).

    ``pieces`` hold a GPU container ``w`` (``w.c``, ``w.gpus``, ``w.mib``,
    ``w.sm``); ``pod_pieces`` the pod, its scheduler and status first:
    all the driver leaves the webhook to set under ``dra.driverSetsLimits``.
    """
    driver_pod = pod_pieces[:2]
    return [
        (
            "draClaims",
            "has(object.spec.resourceClaims) ? object.spec.resourceClaims.filter(r, "
            f"r.name.startsWith('{PREFIX}') && has(r.resourceClaimTemplateName) && "
            f"r.resourceClaimTemplateName.matches('{TEMPLATE_PATTERN}')) : []",
        ),
        ("draWant", _WANT),
        ("draAsked", _ASKED),
        ("draClasses", _CLASSES),
        (
            "draOk",
            "size(variables.draAsked) == 0 && size(variables.draClasses) == 0 && "
            "(size(variables.draWant) == 0 || (variables.driverSetsLimits ? "
            f"({all_of(driver_pod)}) : ({all_of(pod_pieces)} && "
            f"variables.draWant.all(w, {all_of(pieces)}))))",
        ),
        (
            "draLacks",
            "variables.driverSetsLimits ? [] : variables.draWant.map(w, "
            f"[w.c.name + \"' (claim template \" + w.t + ')'] + {missing(pieces)}"
            ".filter(s, s != '')).filter(l, size(l) > 1)"
            ".map(l, \"container '\" + l[0] + ' lacks ' + l.slice(1, size(l)).join(', '))",
        ),
        (
            "draPodLacks",
            "size(variables.draWant) == 0 ? [] : (variables.driverSetsLimits ? "
            f"{missing(driver_pod)} : {missing(pod_pieces)}).filter(s, s != '')",
        ),
        (
            "draProblems",
            "variables.draAsked + variables.draClasses + (size(variables.draPodLacks) > 0 ? "
            "['the pod lacks ' + variables.draPodLacks.join(', ')] : []) + variables.draLacks",
        ),
    ]


# pragma: no mutate end
