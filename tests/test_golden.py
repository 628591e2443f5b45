"""Golden AdmissionReviews: every tests/golden/<case>/ is a request, its answer and the pod stored.

Each case holds ``request.json`` (an AdmissionReview as the apiserver sends
it), ``response.json`` (the expected answer, its patch given as the number
of its operations), ``stored.json`` where the pod is set up (the pod as the
patch leaves it, whole: what the API server stores, as a sidecar
injector's tests compare input and output pods) and, optionally,
``policy.yaml``. A change to what every GPU pod gets rewrites the stored
pods, not index-addressed operations. A mutated pod is fed back to prove the
webhook is a fixed point of itself. ``GOLDEN_UPDATE=1 pytest
tests/test_golden.py`` rewrites the expected files; review the diff before
committing it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import apply, decode_patch
from webhook.decision.admission import admit
from webhook.decision.policy import DEFAULT_POLICY, Policy, parse_policy_text
from webhook.decision.prepared import Prepared
from webhook.preview import preview

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"
CASE_FILES = {"request.json", "response.json", "stored.json", "policy.yaml"}
CASES = sorted(path for path in GOLDEN.iterdir() if path.is_dir())


def _policy(case: Path) -> Policy:
    path = case / "policy.yaml"
    return parse_policy_text(path.read_text()) if path.exists() else DEFAULT_POLICY


def readable(body: dict[str, Any]) -> dict[str, Any]:
    """The answer as a reviewer reads it: the patch as its number of operations.

    What the patch does is in ``stored.json``; its size stays pinned here,
    since the API server pays for every operation.
    """
    out = json.loads(json.dumps(body))
    response = out.get("response", {})
    if "patch" in response:
        response["patch"] = {"operations": len(decode_patch(response))}
    return out  # type: ignore[no-any-return]


def _check_stored(case: Path, stored: dict[str, Any] | None) -> None:
    path = case / "stored.json"
    if UPDATE:
        if stored is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps(stored, indent=2, ensure_ascii=False) + "\n")
    expected = json.loads(path.read_text()) if path.exists() else None
    assert stored == expected, f"{case.name}: the stored pod differs from stored.json"


def test_every_golden_file_is_used() -> None:
    stray = [
        str(path.relative_to(GOLDEN))
        for path in GOLDEN.rglob("*")
        if path.is_file()
        and path.name != "README.md"
        and (path.parent == GOLDEN or path.name not in CASE_FILES)
    ]
    assert not stray, f"files no golden case reads: {stray}"
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_golden(case: Path) -> None:
    policy = _policy(case)
    request = json.loads((case / "request.json").read_text())
    result = admit(json.dumps(request).encode(), Prepared(policy))
    wire = json.loads(result.encode())  # the answer as it goes on the wire
    got = readable(wire)
    expected_path = case / "response.json"
    if UPDATE:
        expected_path.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    assert expected_path.exists(), f"{case.name}: no response.json (run with GOLDEN_UPDATE=1)"
    assert got == json.loads(expected_path.read_text())

    response = wire["response"]
    assert response["uid"] == request["request"]["uid"]
    assert wire["apiVersion"] == request["apiVersion"]
    ops = decode_patch(response)
    _check_stored(case, apply(request["request"]["object"], ops) if ops else None)
    if ops:
        # Idempotence: the webhook's own output needs nothing more.
        mutated = apply(request["request"]["object"], ops)
        again = dict(request, request={**request["request"], "object": mutated})
        second = json.loads(admit(json.dumps(again).encode(), Prepared(policy)).encode())[
            "response"
        ]
        assert second["allowed"] is True
        assert "patch" not in second, decode_patch(second)


def _pod_cases() -> list[Path]:
    """The cases whose request creates a Pod: the ones the offline preview can also judge."""
    chosen = []
    for case in CASES:
        try:
            request = json.loads((case / "request.json").read_text())["request"]
        except (ValueError, KeyError, TypeError):
            continue  # a body that is not a review: only the webhook sees those
        kind = request.get("kind") if isinstance(request, dict) else None
        if (
            kind == {"group": "", "version": "v1", "kind": "Pod"}
            and request.get("operation") == "CREATE"
            and not request.get("subResource")
            and isinstance(request.get("object"), dict)
        ):
            chosen.append(case)
    return chosen


POD_CASES = _pod_cases()


@pytest.mark.parametrize("case", POD_CASES, ids=[case.name for case in POD_CASES])
def test_golden_through_the_preview(case: Path) -> None:
    """``gpushare-webhook mutate`` gives each pod the webhook's answer: one code path."""
    request = json.loads((case / "request.json").read_text())["request"]
    expected = json.loads((case / "response.json").read_text())["response"]
    pod = {"apiVersion": "v1", "kind": "Pod", **request["object"]}
    namespace = request.get("namespace", "")
    if isinstance(pod.get("metadata"), dict) and namespace:
        # The review's namespace is the one the API server creates the pod in.
        pod["metadata"] = {**pod["metadata"], "namespace": namespace}
    result = preview(pod, Prepared(_policy(case)), namespace=namespace)
    assert result.decision is not None
    assert result.decision.allowed is expected["allowed"], result.decision.message
    if not expected["allowed"]:
        assert result.decision.message == expected["status"]["message"]
    stored_path = case / "stored.json"
    if stored_path.exists():
        assert apply(request["object"], list(result.patch)) == json.loads(stored_path.read_text())
    else:
        assert result.patch == []
