"""One admission, body in and answer out: the envelope, what the answer carries for logs
and metrics, an internal failure, and how the answer is written.

``decode``'s refusals are matched whole (the HTTP layer's 400 for them is
tests/test_app.py's); ``Result`` carries what the log line, the metrics
and the audit annotations are made of; a response's warnings are cut to
what the API server keeps whole.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest

from tests.helpers import container, pod, review
from webhook.decision import patch, responses
from webhook.decision.admission import admit
from webhook.decision.capacity import GpuBounds, GpuNode
from webhook.decision.decoding import MAX_UID, decode
from webhook.decision.policy import DEFAULT_POLICY
from webhook.decision.prepared import Prepared
from webhook.errors import ReviewError
from webhook.reasons import Reason


def body(**request: Any) -> bytes:
    envelope = review(pod(container(gpu="4")))
    envelope["request"].update(request)
    return json.dumps(envelope).encode()


UID = review(None)["request"]["uid"]
REFUSED = [
    (b"", "empty body: expected an AdmissionReview JSON object"),
    (b"\xff{}", "body is not UTF-8 JSON"),
    (b"{", "body is not valid JSON: Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1)"),
    (b"[" * 100000, "body is nested too deeply to be an AdmissionReview"),
    (b"[]", "body must be a JSON object (an AdmissionReview)"),
    (b'{"kind": "Pod"}', "kind is 'Pod'; expected 'AdmissionReview'"),
    (b'{"apiVersion": "admission.k8s.io/v1"}', "kind is missing; expected 'AdmissionReview'"),
    (b'{"kind": "AdmissionReview"}',
     "apiVersion is missing; expected one of admission.k8s.io/v1, admission.k8s.io/v1beta1"),
    (b'{"kind": "AdmissionReview", "apiVersion": "v1"}',
     "apiVersion is 'v1'; expected one of admission.k8s.io/v1, admission.k8s.io/v1beta1"),
    (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": []}',
     "request is missing or not an object"),
    (body(uid=""), "request.uid must be a non-empty string (it is echoed in the response)"),
    (body(uid="u" * (MAX_UID + 1)),
     "request.uid must be a non-empty string (it is echoed in the response)"),
    (body(kind={"group": "", "version": "v1"}),
     "request.kind must be an object with string group, version and kind"),
    (body(operation=1), "request.operation must be a string such as 'CREATE'"),
    (body(namespace=7), "request.namespace must be a string"),
    (body(name=["train"]), "request.name must be a string"),
    (body(subResource={}), "request.subResource must be a string"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "message"), REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_a_malformed_review_is_refused_with_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(ReviewError) as caught:
        decode(data)
    assert str(caught.value) == message
    result = admit(data, Prepared(DEFAULT_POLICY))
    assert (result.status, result.body, result.outcome) == (400, {"error": message}, "bad-request")
    assert result.encode() == json.dumps({"error": message}, separators=(",", ":")).encode()


def test_the_longest_uid_and_absent_optional_fields_are_accepted() -> None:
    envelope = review(None)
    request = envelope["request"]
    request["uid"] = "u" * MAX_UID
    for key in ("namespace", "name", "subResource"):
        request.pop(key, None)
    api_version, decoded = decode(json.dumps(envelope).encode())
    assert (api_version, decoded) == ("admission.k8s.io/v1", request)
    assert decode(body(namespace=None, name=None, subResource=None))[1]["namespace"] is None


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-32"], ids=lambda e: e)
def test_a_body_is_read_as_json_loads_reads_bytes(encoding: str) -> None:
    """Any JSON encoding (RFC 8259's, and a BOM), and a lone surrogate written raw in UTF-8."""
    envelope = review(pod(container(gpu="4")))
    envelope["request"]["uid"] = "uid-\ud800"
    text = json.dumps(envelope, ensure_ascii=False)
    data = text.encode(encoding, "surrogatepass")
    assert decode(data) == decode(json.dumps(envelope).encode())
    result = admit(data, Prepared(DEFAULT_POLICY))
    assert (result.status, result.uid, result.outcome) == (200, "uid-\ud800", "mutated")
    assert b'"uid":"uid-\\ud800"' in result.encode()


def test_a_key_given_twice_is_read_as_json_loads_reads_it() -> None:
    """The API server never sends one; the check for it is made where a person's file is read."""
    data = b'{"b": 0, "a": 1, "a": 2}'
    with pytest.raises(ReviewError, match=r"^kind is missing"):
        decode(data)
    envelope = json.dumps(review(pod(container(gpu="4"))))
    twice = envelope.replace('"uid": ', '"uid": "first", "uid": ', 1).encode()
    assert decode(twice) == decode(envelope.encode())


@pytest.mark.parametrize(
    ("metadata", "request_name", "name"),
    [
        ({"name": "train"}, None, "train"),
        ({"generateName": "train-"}, None, "train-"),
        ({"name": "", "generateName": "train-"}, "x", "train-"),
        ({}, "train-7", "train-7"),
        (None, "train-7", "train-7"),
        ({"name": 7}, None, ""),
        ({}, None, ""),
    ],
    ids=["name", "generate-name", "empty-name", "request-name", "no-metadata", "odd", "none"],
)
def test_the_answer_names_the_pod_for_the_log(
    metadata: dict[str, Any] | None, request_name: str | None, name: str
) -> None:
    obj = pod(container(gpu="4"))
    if metadata is None:
        del obj["metadata"]
    else:
        obj["metadata"] = metadata
    envelope = review(obj, namespace="")
    envelope["request"]["name"] = request_name
    envelope["request"]["dryRun"] = True
    result = admit(json.dumps(envelope).encode(), Prepared(DEFAULT_POLICY))
    assert (result.uid, result.namespace, result.name) == (UID, "", name)
    assert result.dry_run is True
    assert (result.status, result.outcome, result.error, result.trace) == (200, "mutated", "", "")


def test_an_object_that_is_not_a_mapping_is_named_by_the_request() -> None:
    envelope = review("pod", namespace="team-a")
    envelope["request"]["name"] = "train"
    result = admit(json.dumps(envelope).encode(), Prepared(DEFAULT_POLICY))
    assert (result.namespace, result.name, result.dry_run) == ("team-a", "train", False)
    assert result.outcome == "rejected"


class Broken(Prepared):
    """Bounds that fail: a bug in the decision, which the real ones cannot make."""

    def bounds(self, spec: Mapping[str, Any]) -> GpuBounds:
        raise RuntimeError("no bounds")


def test_a_bug_is_answered_as_a_refusal_with_the_trace_for_the_log() -> None:
    result = admit(body(dryRun=True), Broken(DEFAULT_POLICY))
    message = (
        "gpushare-webhook internal error: RuntimeError while admitting the pod; "
        "see the webhook's log"
    )
    assert result.status == 200
    assert result.body == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": UID,
            "allowed": False,
            "status": {"code": 500, "message": message, "reason": "InternalError"},
            "auditAnnotations": {"decision": "error", "reason": "internal"},
        },
    }
    assert result.reason == Reason.INTERNAL  # the log line's and the metric's too
    assert (result.outcome, result.error, result.decision) == (
        "error",
        "RuntimeError('no bounds')",
        None,
    )
    assert (result.uid, result.namespace, result.name) == (UID, "team-a", "train")
    assert result.dry_run is True
    assert result.trace.startswith("Traceback")
    assert "RuntimeError: no bounds" in result.trace
    assert json.loads(result.encode()) == result.body


def test_the_view_note_is_a_warning_on_gpu_pods_only() -> None:
    view = Prepared(
        DEFAULT_POLICY, note="GPU sizes come from the policy's gpuMemory (16 GiB): not read yet"
    )
    gpu = admit(body(), view).body["response"]
    assert gpu["warnings"] == [view.note]
    plain = review(pod(container()))
    untouched = admit(json.dumps(plain).encode(), view)
    assert "warnings" not in untouched.body["response"]
    assert untouched.decision is not None
    assert untouched.decision.warnings == ()  # nor in the log line


@pytest.mark.parametrize(
    ("code", "reason"), [(403, "Forbidden"), (400, "BadRequest"), (500, "InternalError")]
)
def test_a_denial_carries_the_reason_for_its_code(code: int, reason: str) -> None:
    assert responses.denied("u", "m", code=code)["status"] == {
        "code": code,
        "message": "m",
        "reason": reason,
    }
    assert responses.denied("u", "m")["status"]["code"] == 403


# What the API server keeps whole: 3 KiB of warnings in all, 10 at most,
# each printable (it drops one with a control character).
WARNINGS = [
    (["a" * 100] * 12, ["a" * 100] * 10),
    (["a" * 3072], ["a" * 3072]),
    (["a" * 3073], ["a" * 3069 + "..."]),
    (["a" * 3000, "b" * 100, "c"], ["a" * 3000, "b" * 69 + "..."]),
    (["a" * 3068, "b" * 10], ["a" * 3068, "b..."]),
    (["a" * 3069, "b" * 10], ["a" * 3069]),
    (["line\nbreak\x00", "tab\there"], ["line?break?", "tab?here"]),
    (["ünïcode ✓"], ["ünïcode ✓"]),
]


@pytest.mark.parametrize(("given", "kept"), WARNINGS, ids=range(len(WARNINGS)))
def test_warnings_are_kept_whole_within_what_the_api_server_keeps(
    given: list[str], kept: list[str]
) -> None:
    assert responses.allowed("u", warnings=given)["warnings"] == kept


@pytest.mark.parametrize("with_patch", [True, False])
def test_the_answer_is_written_once_as_the_json_encoder_would(with_patch: bool) -> None:
    """Data until the wire: the patch, base64 of its ops' JSON, is written with the rest."""
    obj = pod(container(gpu="4")) if with_patch else pod(container())
    result = admit(json.dumps(review(obj, version="v1beta1")).encode(), Prepared(DEFAULT_POLICY))
    response = dict(result.body["response"])
    assert ("patch" in response) is with_patch
    if with_patch:
        assert result.decision is not None
        ops = json.dumps([dict(op) for op in result.decision.patch], separators=(",", ":"))
        response["patch"] = base64.b64encode(ops.encode()).decode()
    expected = json.dumps({**result.body, "response": response}, separators=(",", ":"))
    assert result.encode() == expected.encode()


@pytest.mark.parametrize(
    ("token", "escaped"),
    [("env", "env"), ("gpushare-webhook.io/status", "gpushare-webhook.io~1status"),
     ("a~b", "a~0b"), ("~1", "~01"), ("/~", "~1~0")],
)  # fmt: skip
def test_a_key_in_a_patch_path_is_escaped_as_json_pointer_says(token: str, escaped: str) -> None:
    # RFC 6901: "~" first, so that the "~1" made for "/" is not escaped again.
    assert patch.escape(token) == escaped
    op = patch.set_field({}, token, "/metadata/annotations", "v")
    assert patch.plain([op]) == (
        {"op": "add", "path": f"/metadata/annotations/{escaped}", "value": "v"},
    )


def test_a_pod_whose_spec_is_not_an_object_is_placed_anywhere() -> None:
    # The view bounds it before the plan finds it is no GPU pod: no placement to read.
    view = Prepared(DEFAULT_POLICY, [GpuNode("a", 80, 2, {"pool": "a"})])
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": ["containers"]}
    result = admit(json.dumps(review(obj)).encode(), view)
    assert (result.outcome, result.decision and result.decision.reason) == (
        "untouched",
        "no-gpu-request",
    )
