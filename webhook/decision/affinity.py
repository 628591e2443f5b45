"""Placing a GPU pod only where the shim is: the node label the node agent keeps, required.

Owns the label's name and the ops that add ``<label> Exists`` to a pod's
required node affinity (policy ``shim.requireNodeLabel``). Kubernetes ORs
a pod's ``nodeSelectorTerms`` and ANDs the requirements inside each, so
the requirement goes into every term: a term left without it would let
the pod onto a node without the shim. A pod with no terms gets one term
holding only it. A term that already requires the label is left alone,
so the webhook stays a fixed point on its own output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.decision import patch
from webhook.decision.fields import mapping
from webhook.decision.patch import Op
from webhook.decision.policy import Policy
from webhook.errors import ShapeError

SHIM_LABEL = "gpushare-webhook.io/shim"  # set by the node agent to the shim's short sha256
REQUIREMENT = {"key": SHIM_LABEL, "operator": "Exists"}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def affinity_ops(spec: Mapping[str, Any], policy: Policy) -> list[Op]:
    """The ops that make every required node selector term ask for the shim's label."""
    if not policy.shim.require_node_label:
        return []
    term = {"matchExpressions": [dict(REQUIREMENT)]}
    path = "/spec"
    parent: Mapping[str, Any] = spec
    for field, value in (
        ("affinity", {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [term]}}}),
        ("nodeAffinity", {REQUIRED: {"nodeSelectorTerms": [term]}}),
        (REQUIRED, {"nodeSelectorTerms": [term]}),
    ):
        if parent.get(field) is None:
            return [patch.set_field(parent, field, path, value)]
        parent = mapping(
            parent, field, path=path.removeprefix("/").replace("/", "."), optional=False
        )
        path = f"{path}/{field}"
    terms = parent.get("nodeSelectorTerms")
    if not terms:  # absent or empty: the API server requires one, so none restricts yet
        return [patch.set_field(parent, "nodeSelectorTerms", path, [term])]
    where = path.removeprefix("/").replace("/", ".") + ".nodeSelectorTerms"
    if not isinstance(terms, list):
        raise ShapeError(where, "a list", terms)
    ops: list[Op] = []
    for index, found in enumerate(terms):
        ops += _term_ops(found, f"{path}/nodeSelectorTerms/{index}", f"{where}[{index}]")
    return ops


def _term_ops(term: object, path: str, where: str) -> list[Op]:
    if not isinstance(term, dict):
        raise ShapeError(where, "an object", term)
    expressions = term.get("matchExpressions")
    if not expressions and not term.get("matchFields"):
        # An empty term matches no node; given the label it would match every labelled one.
        return []
    if expressions is None:
        return [patch.set_field(term, "matchExpressions", path, [dict(REQUIREMENT)])]
    if not isinstance(expressions, list):
        raise ShapeError(f"{where}.matchExpressions", "a list", expressions)
    if any(_requires_label(e) for e in expressions):
        return []
    return [patch.add(f"{path}/matchExpressions/-", dict(REQUIREMENT))]


def _requires_label(expression: object) -> bool:
    return (
        isinstance(expression, dict)
        and expression.get("key") == SHIM_LABEL
        and expression.get("operator") == "Exists"
    )
