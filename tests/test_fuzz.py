"""Fuzzing the decision and the HTTP endpoint: whatever comes in, a precise answer goes out.

Invariants, for random and mutated AdmissionReviews (wrong types in every
field, deep nesting, huge arrays, unicode, quantities at every boundary):
``admit`` never raises and never fails internally; the answer is HTTP 400
or a well-formed AdmissionReview echoing the uid; a patch always applies to
the original object; and no accepted container asks more than the largest
GPU. Over HTTP against the real server: no 5xx, no traceback, and the
server keeps serving.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Server
from tests.helpers import GPU, container, decode_patch, examples, pod, review
from webhook.decision.admission import admit
from webhook.decision.policy import DEFAULT_POLICY
from webhook.decision.prepared import Prepared

ROOT = Path(__file__).parent.parent
GOLDEN = sorted((Path(__file__).parent / "golden").glob("*/request.json"))
SEEDS = [json.loads(path.read_text()) for path in GOLDEN]

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    # Lone surrogates too: JSON may carry "\ud800", which has no UTF-8 form.
    | st.text(st.characters(exclude_categories=()), max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Quantities around every edge the grammar and the policy have.
QUANTITIES = st.sampled_from(
    [
        "0", "1", "16", "17", "15.999", "16.0", "16.5", "1e1", "1E1", "2e0", "1.6e1", "0.16e2",
        "16m", "16000m", "16k", "16Ki", "16Mi", "16Gi", "1Ti", "-1", "-0", "+4", ".5", "4.",
        " 4", "4 ", "0x10", "١٦", "4\u00a0", "", "9" * 70, "1e30", "1e-30", "Infinity", "NaN",
    ]
) | JSON  # fmt: skip


def check_answer(request: dict[str, Any], body: bytes) -> None:
    """The invariants of one answer to ``request`` (already known to decode)."""
    result = admit(body, Prepared(DEFAULT_POLICY))
    assert result.outcome != "error", result.error  # an internal failure is a bug
    encoded = result.encode().decode()
    assert "Traceback" not in encoded
    if result.status == 400:
        assert set(result.body) == {"error"}
        return
    assert result.status == 200
    response = json.loads(encoded)["response"]  # as it goes on the wire
    assert response["uid"] == request["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["message"]
        return
    ops = decode_patch(response)
    if not ops:
        return
    out = jsonpatch.apply_patch(copy.deepcopy(request["request"]["object"]), ops)
    largest_mib = DEFAULT_POLICY.gpu_memory * DEFAULT_POLICY.mib_per_unit
    for kind in ("containers", "initContainers"):
        for c in out["spec"].get(kind) or []:
            limit = ((c.get("resources") or {}).get("limits") or {}).get(GPU)
            if limit is None:
                continue
            # What the shim will enforce on each GPU: within the largest one, and
            # every per-device variable equal to the plain one.
            env = {e["name"]: e.get("value") for e in c["env"]}
            per_gpu = {v for k, v in env.items() if k.startswith("CUDA_DEVICE_MEMORY_LIMIT")}
            assert len(per_gpu) == 1, env
            assert int(per_gpu.pop().removesuffix("m")) <= largest_mib


def places(node: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) pair in a JSON document, depth first."""
    found: list[tuple[Any, Any]] = []
    if isinstance(node, dict):
        for key in node:
            found += [(node, key), *places(node[key])]
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += [(node, index), *places(item)]
    return found


@st.composite
def mutated_reviews(draw: st.DrawFn) -> dict[str, Any]:
    """A golden request with a few values anywhere in it replaced, removed or retyped."""
    doc = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        paths = places(doc)
        if not paths:
            break
        parent, key = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "delete", "quantity"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[key]
        elif action == "quantity":
            parent[key] = draw(QUANTITIES)
        else:
            parent[key] = draw(JSON)
    return doc


# FUZZ_EXAMPLES=20000 python3 -m pytest tests/test_fuzz.py digs deeper than CI does.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", examples(300)))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(mutated_reviews())
def test_mutated_reviews_get_precise_answers(request: dict[str, Any]) -> None:
    check_answer(request, json.dumps(request).encode())


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["main", "b", "c"]), QUANTITIES), min_size=1, max_size=4))
def test_quantities_at_every_boundary(asks: list[tuple[str, Any]]) -> None:
    containers = [container(f"{name}{i}", gpu=q) for i, (name, q) in enumerate(asks)]
    request = review(pod(*containers))
    check_answer(request, json.dumps(request).encode())


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode()))
def test_arbitrary_bodies_are_400_or_answered(body: bytes) -> None:
    result = admit(body, Prepared(DEFAULT_POLICY))
    assert result.status in (200, 400)
    assert result.outcome != "error"


def test_deep_nesting_and_huge_arrays() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert admit(deep.encode(), Prepared(DEFAULT_POLICY)).status == 400
    many = review(pod(*[container(f"c{i}", gpu="1") for i in range(2_000)]))
    result = admit(json.dumps(many).encode(), Prepared(DEFAULT_POLICY))
    assert result.status == 200
    assert result.body["response"]["allowed"] is False  # 2000 GiB on one 16 GiB GPU
    env = review(
        pod(container(gpu="1", env=[{"name": f"V{i}", "value": "x"} for i in range(50_000)]))
    )
    check_answer(env, json.dumps(env).encode())


def test_non_pods_claiming_to_be_pods() -> None:
    for obj in (
        {"kind": "Deployment", "spec": {"template": {"spec": {"containers": []}}}},
        {"apiVersion": "v1", "kind": "Pod", "spec": []},
        {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": {"main": {}}}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "spec": {"containers": [{"resources": {"limits": [GPU]}}]},
        },
        [pod()],
        "a pod",
    ):
        request = review(obj)
        check_answer(request, json.dumps(request).encode())


HTTP_BODIES = (
    mutated_reviews().map(lambda r: json.dumps(r).encode())
    | st.binary(max_size=200)
    | JSON.map(lambda v: json.dumps(v).encode())
    | st.text(max_size=50).map(lambda t: t.encode("utf-8", "surrogatepass"))
)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    HTTP_BODIES,
    st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", ""]),
)
def test_http_endpoint_never_fails(server: Server, body: bytes, content_type: str) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    status, answer = server.request("POST", "/mutate", body, headers)
    assert status in (200, 400, 413, 415), (status, answer[:300])
    assert b"Traceback" not in answer
    decoded = json.loads(answer)
    if status == 200:
        assert decoded["kind"] == "AdmissionReview"
        assert isinstance(decoded["response"]["allowed"], bool)
    else:
        assert decoded["error"]


def test_http_answer_carries_a_lone_surrogate_back(server: Server) -> None:
    # The uid is echoed; "\ud800" has no UTF-8 form, so it goes back escaped.
    body = json.dumps(review(pod(container(gpu="1")), uid="\ud800")).encode()
    status, answer = server.request("POST", "/mutate", body, {"Content-Type": "application/json"})
    assert status == 200, answer[:300]
    assert b'"uid":"\\ud800"' in answer
    assert json.loads(answer)["response"]["uid"] == "\ud800"


def test_server_still_serves_after_the_fuzzing(server: Server) -> None:
    status, _ = server.request("GET", "/healthz")
    assert status == 200


def test_atheris_harness_runs_clean(tmp_path: Path) -> None:
    """A short coverage-guided run of fuzz/admit_atheris.py from the golden seeds."""
    pytest.importorskip("atheris", reason="atheris ships wheels for x86_64 Linux only")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in GOLDEN:
        (corpus / f"{path.parent.name}.json").write_bytes(path.read_bytes())
    done = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "admit_atheris.py"), "-runs=20000", str(corpus)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=tmp_path,  # a crash input would be written here
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "DONE" in done.stderr
