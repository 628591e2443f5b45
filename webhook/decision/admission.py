"""One admission: body bytes in, (HTTP status, AdmissionReview) out.

Ties decoding, planning and responses together. It is still pure — the
prepared policy and its GPU nodes come in as an argument — so the HTTP
layer, the offline CLI and the benchmarks all run exactly this code. The
answer stays data (its patch as ops) until :meth:`Result.encode` writes
it, the one place it becomes text.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.decision import responses
from webhook.decision.decoding import decode
from webhook.decision.plan import Decision, plan, plan_ephemeral, untouched
from webhook.decision.prepared import Prepared
from webhook.decision.reviews import Request
from webhook.errors import ReviewError
from webhook.reasons import Reason


@dataclass(frozen=True)
class Result:
    """What happened to one review: for the HTTP answer, the log line and metrics."""

    status: int
    body: Mapping[str, Any]  # the AdmissionReview (or error) as data, its patch as ops
    decision: Decision | None = None
    uid: str = ""
    namespace: str = ""
    name: str = ""
    error: str = ""
    trace: str = ""  # the traceback of an internal error, for the caller's log
    dry_run: bool = False

    @property
    def outcome(self) -> str:
        if self.status != 200:
            return "bad-request"
        if self.error:
            return "error"
        return self.decision.outcome if self.decision else "untouched"

    @property
    def reason(self) -> Reason:
        """Why: the log line, the metric and the audit annotation all read it here."""
        if self.status != 200:
            return Reason.BAD_REQUEST
        if self.decision is None:  # a bug, answered as a refusal (``error`` says which)
            return Reason.INTERNAL
        return self.decision.reason

    def encode(self) -> bytes:
        """The body as it goes on the wire: compact ASCII JSON, the patch in base64."""
        return responses.encode(self.body)


def _is_pod(request: Request) -> bool:
    kind = request["kind"]
    return kind["group"] == "" and kind["kind"] == "Pod"


def _pod_name(request: Request) -> str:
    obj = request.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        name = meta.get("name") or meta.get("generateName")
        if isinstance(name, str):
            return name
    return request.get("name") or ""


def decide(request: Request, prepared: Prepared) -> Decision:
    """The decision for a decoded request: the rules for which requests are looked at."""
    if not _is_pod(request):
        return untouched(Reason.NOT_A_POD)
    pod = request.get("object")
    namespace = request.get("namespace") or ""
    sub = request.get("subResource")
    if sub == "ephemeralcontainers" and request["operation"] == "UPDATE":
        return plan_ephemeral(pod, prepared.policy, namespace=namespace)
    if sub:
        return untouched(Reason.SUBRESOURCE)
    if request["operation"] != "CREATE":
        return untouched(Reason.NOT_CREATE)
    spec = pod.get("spec") if isinstance(pod, dict) else None
    bounds = prepared.bounds(spec if isinstance(spec, dict) else {})
    return plan(pod, prepared, namespace=namespace, bounds=bounds)


def admit(body: bytes, prepared: Prepared) -> Result:
    """Answer one AdmissionReview body. Never raises: a bug is answered as a denial.

    ``prepared`` holds the policy and the GPU nodes pods are bounded by
    (none: the policy's ``gpuMemory``); its note (why the nodes are not
    known) is added to the warnings of every GPU pod, whose bounds then
    come from the policy.
    """
    try:
        api_version, request = decode(body)
    except ReviewError as error:
        return Result(status=400, body={"error": str(error)}, error=str(error))
    uid = request["uid"]
    namespace = request.get("namespace") or ""
    name = _pod_name(request)
    dry_run = request.get("dryRun") is True
    try:
        decision = decide(request, prepared)
        note = prepared.note
        if note and decision.outcome != "untouched":
            decision = dataclasses.replace(decision, notes=(*decision.notes, note))
        answer = _respond(uid, decision)
    except Exception as error:  # a bug must become a denial, never a dropped pod
        # Like controller-runtime's panic recovery, the failure is answered
        # in-band (HTTP 200, allowed: false, code 500) with a readable reason.
        # kube-apiserver reads that as a denial, not as a call failure: the
        # pod is refused under failurePolicy Ignore as under Fail (tested in
        # tests/apiserver/test_admission.py). A bug must not admit a GPU pod
        # unconfined; only an unreachable or timed-out webhook is "Ignore"d.
        message = f"{type(error).__name__} while admitting the pod; see the webhook's log"
        audit = {"decision": "error", "reason": Reason.INTERNAL.value}
        return Result(
            status=200,
            body=responses.review(api_version, responses.errored(uid, message, audit=audit)),
            uid=uid,
            namespace=namespace,
            name=name,
            error=repr(error),
            trace=traceback.format_exc(),
            dry_run=dry_run,
        )
    return Result(
        status=200,
        body=responses.review(api_version, answer),
        decision=decision,
        uid=uid,
        namespace=namespace,
        name=name,
        dry_run=dry_run,
    )


def _respond(uid: str, decision: Decision) -> Any:
    audit = {"decision": decision.outcome, "reason": decision.reason.value}
    if len(decision.problems) > 1:
        audit["reasons"] = ",".join(decision.reasons)
    if not decision.allowed:
        return responses.denied(
            uid, decision.message, code=decision.code, warnings=decision.warnings, audit=audit
        )
    if decision.outcome == "untouched":
        return responses.allowed(uid)
    return responses.patched(uid, decision.ops, warnings=decision.warnings, audit=audit)
