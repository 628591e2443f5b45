"""The rules, one case each: tests/rules/<topic>.yaml, a pod and the answer it must get.

Each case states the rule it pins (``rule``; its test id is made from that
text), then the pod's ``spec`` (and ``metadata`` over the usual name and
namespace; or a whole ``object``), optionally a ``policy`` (YAML text), the
cluster's ``nodes`` (Node objects as the API serves them), under ``scheduler:
dra`` its ``resourceSlices`` and ``deviceClasses``, and ``request``
fields over the usual CREATE of a Pod. ``answer`` is what the webhook says,
through ``admit`` as the API server calls it: outcome, reason, HTTP code
and message of a refusal, warnings, audit annotations, and the patch,
decoded, less what every GPU pod of the policy gets alike: the scheduler's
name, the layout's volumes and mounts, the pinned variables and the
status annotation, each as the layout has them, are named by path only
(``setUp``); a whole list the patch sets (an env, mounts, the volumes)
shows only its other entries (the user's, and those the webhook changed).
So a change of layout rewrites the goldens' stored pods, not every case.
``GOLDEN_UPDATE=1 pytest tests/test_rules.py`` rewrites the answers; read
the diff before committing it.

Where the goldens in tests/golden show whole AdmissionReviews for the
common cases, these tables reach each rule in every position it can be met
(the second container, an init container, the third env entry), at each
side of every boundary, and in each shape the API server lets through.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import apply, decode_patch, review, rewrite_case
from webhook.decision import rules
from webhook.decision.admission import admit
from webhook.decision.asks import ContainerAsk
from webhook.decision.fields import STATUS_ANNOTATION
from webhook.decision.inject import init_step, status_text
from webhook.decision.layout import PRELOAD
from webhook.decision.nodesource import (
    DraFacts,
    NodeStatus,
    class_of,
    devices_of,
    facts_of,
    prepare,
)
from webhook.decision.patch import escape
from webhook.decision.plan import Decision
from webhook.decision.policy import DEFAULT_POLICY, Policy, parse_policy_text
from webhook.decision.prepared import Prepared
from webhook.decision.quantities import limit_text
from webhook.reasons import Reason

RULES = Path(__file__).parent / "rules"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"
CASE_KEYS = {
    "rule",
    "spec",
    "metadata",
    "object",
    "policy",
    "nodes",
    "resourceSlices",
    "deviceClasses",
    "request",
    "answer",
}


def _load(path: Path) -> list[dict[str, Any]]:
    cases = yaml.safe_load(path.read_text())
    assert isinstance(cases, list), f"{path.name}: a list of cases"
    return cases


FILES = sorted(RULES.glob("*.yaml"))
CASES = [(path, index, case) for path in FILES for index, case in enumerate(_load(path))]


def _id(path: Path, index: int, case: dict[str, Any]) -> str:
    """The case's id, from its rule's text: it names the rule, and stays when cases move."""
    words = re.sub(r"[^a-z0-9]+", "-", str(case.get("rule", index)).lower()).strip("-")
    return f"{path.stem}:{words[:80].rstrip('-')}"


def _policy(case: dict[str, Any]) -> Policy:
    text = case.get("policy")
    return parse_policy_text(text) if text else DEFAULT_POLICY


def _prepared(case: dict[str, Any]) -> Prepared:
    policy = _policy(case)
    nodes = case.get("nodes")
    slices, classes = case.get("resourceSlices"), case.get("deviceClasses")
    if nodes is None and slices is None and classes is None:
        return Prepared(policy)
    dra = DraFacts(
        devices=tuple(d for s in slices or () for d in devices_of(s)),
        classes=tuple(c for c in map(class_of, classes or ()) if c is not None),
    )
    facts = [facts_of(n) for n in nodes or ()]
    return prepare(facts, NodeStatus(synced=True), policy, dra)


def _claims(case: dict[str, Any]) -> bool:
    return _policy(case).placed_by.claims


def _request(case: dict[str, Any], obj: Any) -> dict[str, Any]:
    body = review(obj)
    body["request"].update(case.get("request") or {})
    return body


def _pod(case: dict[str, Any]) -> Any:
    if "object" in case:  # an object that is not a pod of the usual form
        return case["object"]
    metadata = {"name": "train", "namespace": "team-a", **(case.get("metadata") or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": case["spec"]}


_MOUNTS = re.compile(r"/spec/(initContainers|containers)/\d+/volumeMounts")
_LISTS = re.compile(r"/spec/(?:volumes|(?:initContainers|containers)/\d+/(?:env|volumeMounts))")
_STATUS = f"/metadata/annotations/{escape(STATUS_ANNOTATION)}"


def _standard(prepared: Prepared, decision: Decision | None) -> list[tuple[str, Any]]:
    """(path, value) of each add that gives a GPU pod what every one of its kind gets.

    The scheduler's name, the layout's volumes and mounts, each GPU
    container's pinned variables and LD_PRELOAD (whole, or appended one by
    one), the init step and the status annotation: a case names them by
    path only (``setUp``), so a change to what every GPU pod gets rewrites
    the goldens' stored pods (tests/golden), not the rule cases.
    """
    layout, policy = prepared.layout, prepared.policy
    found: list[tuple[str, Any]] = [("/spec/schedulerName", policy.scheduler_name)]
    found += [("/spec/volumes", layout.all_volumes)]
    found += [("/spec/volumes/-", volume) for volume in layout.volumes]
    if decision is None or not decision.asks:
        return found
    preload = {"name": PRELOAD, "value": layout.preload}
    for ask in decision.asks:
        base = f"/spec/{ask.kind}/{ask.position}"
        pinned = layout.pin(ask.name, ask.memory_per_gpu, ask.gpus, ask.compute)
        found.append((f"{base}/env", pinned.env))
        found += [(f"{base}/env/-", entry) for entry in (*pinned.entries, preload)]
    if layout.init_image:
        step = init_step(decision.asks, layout)
        found += [("/spec/initContainers", [step]), ("/spec/initContainers/0", step)]
    status = json.loads(status_text(decision.gpu_pod, policy))
    found += [(_STATUS, status), ("/metadata/annotations", {STATUS_ANNOTATION: status})]
    found.append(("/metadata", {"annotations": {STATUS_ANNOTATION: status}}))
    return found


def _set_up(op: dict[str, Any], standard: list[tuple[str, Any]], prepared: Prepared) -> bool:
    """Whether ``op`` adds what every GPU pod of the policy gets (see ``_standard``)."""
    path, value, mounts = op["path"], op.get("value"), prepared.layout.all_mounts
    if op["op"] != "add":
        return False
    if path == _STATUS or path in ("/metadata/annotations", "/metadata"):
        value = _readable_status(value)
    return (
        (path, value) in standard
        or (_MOUNTS.fullmatch(path) is not None and value == mounts)
        or (path.endswith("/-") and _MOUNTS.fullmatch(path[:-2]) is not None and value in mounts)
    )


def _less_set_up(
    op: dict[str, Any], standard: list[tuple[str, Any]], prepared: Prepared
) -> tuple[bool, dict[str, Any] | None]:
    """A whole list the op sets (an env, mounts, the volumes) less what every GPU pod gets.

    (whether it held any of those entries, the op with the rest or None when
    nothing else is left): the user's entries, and any the webhook changed,
    stay in the case; the set-up's own are named by path in ``setUp``.
    """
    path, value = op["path"], op.get("value")
    if op["op"] == "remove" or not isinstance(value, list) or not _LISTS.fullmatch(path):
        return False, op
    ours = [entry for at, entry in standard if at == f"{path}/-"]
    if _MOUNTS.fullmatch(path):
        ours += prepared.layout.all_mounts
    left = []
    for entry in value:
        if entry in ours:
            ours.remove(entry)  # once each: a second copy of one stays in the case
        else:
            left.append(entry)
    if len(left) == len(value):
        return False, op
    return True, {**op, "value": left} if left else None


def _limits(ask: ContainerAsk, mib_per_unit: int) -> str:
    """``4096m``, ``8192m x2``, ``4096m sm=30``: a container's limits, as a case reads them."""
    text = limit_text(ask.memory_per_gpu * mib_per_unit)
    if ask.gpus > 1:
        text += f" x{ask.gpus}"
    if ask.compute is not None:
        text += f" sm={ask.compute}"
    return text


def _readable_status(value: Any) -> Any:
    """The status annotation's JSON text as data, wherever the op carries it."""
    if isinstance(value, str):
        return json.loads(value)
    if isinstance(value, dict):
        return {
            k: _readable_status(v) if k in (STATUS_ANNOTATION, "annotations") else v
            for k, v in value.items()
        }
    return value


def answer_of(case: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The answer to the case's review, readable, and the patch's operations (all of them)."""
    prepared = _prepared(case)
    result = admit(json.dumps(_request(case, _pod(case))).encode(), prepared)
    assert result.status == 200, result.body
    response = json.loads(result.encode())["response"]  # as it goes on the wire
    ops = decode_patch(response)
    answer: dict[str, Any] = {"outcome": result.outcome}
    if result.decision is not None and result.decision.reason:
        answer["reason"] = result.decision.reason.value
    status = response.get("status")
    if status:
        answer["code"] = status["code"]
        answer["message"] = status["message"]
    for key in ("warnings", "auditAnnotations"):
        if key in response:
            answer[key] = response[key]
    decision = result.decision
    if decision is not None and decision.asks and ops:
        # What each GPU container is held to: the figures the elided set-up pins.
        answer["limits"] = {
            ask.label: _limits(ask, prepared.layout.mib_per_unit) for ask in decision.asks
        }
    standard = _standard(prepared, decision)
    set_up: list[str] = []
    rest = []
    for op in ops:
        if _set_up(op, standard, prepared):
            set_up.append(op["path"])
            continue
        elided, left = _less_set_up(op, standard, prepared)
        if elided:
            set_up.append(op["path"])
        if left is not None:
            rest.append(left)
    if set_up:
        answer["setUp"] = list(dict.fromkeys(set_up))
    if rest:
        answer["patch"] = rest
    return answer, ops


@pytest.mark.parametrize(("path", "index", "case"), CASES, ids=[_id(*c) for c in CASES])
def test_rule(path: Path, index: int, case: dict[str, Any]) -> None:
    assert set(case) <= CASE_KEYS, f"unknown keys {sorted(set(case) - CASE_KEYS)}"
    assert case.get("rule"), "every case states the rule it pins"
    got, ops = answer_of(case)
    if UPDATE:
        rewrite_case(path, index, "answer", got)
    else:
        assert got == case.get("answer"), case["rule"]
    if ops:
        # What the webhook set up, reviewed again, is left alone.
        again = {k: v for k, v in case.items() if k not in ("spec", "metadata")}
        again["object"] = apply(_pod(case), ops)
        second, more = answer_of(again)
        # Under DRA the pod asks no GPU resource any more: its claims do.
        settled = ("unchanged", "warned", "untouched") if _claims(case) else ("unchanged", "warned")
        assert second["outcome"] in settled, second
        assert not more, more


def test_each_rule_is_stated_once() -> None:
    rules = [case.get("rule") for _, _, case in CASES]
    assert len(rules) == len(set(rules)), "two cases state the same rule"
    ids = [_id(*case) for case in CASES]
    assert len(ids) == len(set(ids)), "two rules read alike in their first 80 characters"


def _reasons(answer: dict[str, Any]) -> set[str]:
    """Every reason an answer names: its own, and each its audit annotations list."""
    audit = answer.get("auditAnnotations", {})
    named = {answer.get("reason"), audit.get("reason")}
    named.update(audit.get("reasons", "").split(","))
    return {reason for reason in named if reason}


def test_each_registered_rule_has_a_case_and_each_refusal_a_rule() -> None:
    """A new rule is an entry of the registry and a case here; neither goes without the other."""
    refused = {
        reason
        for _, _, case in CASES
        if case["answer"]["outcome"] in ("rejected", "warned")
        for reason in _reasons(case["answer"]) - {"mutated", "unchanged"}
    }
    assert refused == {rule.reason.value for rule in rules.RULES}


def test_under_warn_a_rule_that_stops_the_set_up_leaves_the_pod_as_it_came() -> None:
    stopping = {reason.value for reason in rules.NOT_INJECTABLE}
    assert stopping, "the registry marks the rules the set-up would meet"
    met = False
    for _, _, case in CASES:
        answer = case["answer"]
        if answer["outcome"] == "warned" and _reasons(answer) & stopping:
            met = True
            assert not {"setUp", "patch"} & set(answer), case["rule"]
    assert met, "a rule case warns of a rule that stops the set-up"


def test_an_ephemeral_container_is_refused_only_by_rules_that_look_at_one() -> None:
    looking = {rule.reason.value for rule in rules.RULES if rules.Looks.EPHEMERAL in rule.looks_at}
    for _, _, case in CASES:
        answer = case["answer"]
        if case.get("request", {}).get("subResource") == "ephemeralcontainers" and answer[
            "outcome"
        ] in ("rejected", "warned"):
            assert _reasons(answer) <= looking, case["rule"]


def test_a_refusal_has_its_rules_code() -> None:
    for _, _, case in CASES:
        answer = case["answer"]
        if answer["outcome"] == "rejected":
            assert answer["code"] == rules.BY_REASON[Reason(answer["reason"])].code, case["rule"]


def test_of_several_problems_the_rule_first_in_the_registry_names_the_refusal() -> None:
    order = [rule.reason.value for rule in rules.RULES]
    several = 0
    for _, _, case in CASES:
        answer = case["answer"]
        if answer["outcome"] in ("rejected", "warned") and len(_reasons(answer)) > 1:
            several += 1
            assert answer["reason"] == min(_reasons(answer), key=order.index), case["rule"]
    assert several, "some case is refused for several rules"
    found = [rules.Problem(Reason.SHIM_MOUNT, "b"), rules.Problem(Reason.MALFORMED_OBJECT, "a")]
    assert rules.first(found) is found[1]
    assert rules.first(found[:1]) is found[0]
