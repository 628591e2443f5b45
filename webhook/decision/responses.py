"""AdmissionReview responses: allowed, denied, patched, errored.

Owns the response envelope. Every constructor echoes the request uid and
answers in the apiVersion the request came in (the apiserver rejects a
response in another version).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from webhook.decision import patch as patching
from webhook.decision.reviews import Response, Review

# The apiserver truncates long warnings and stops at a total of 4 KiB;
# staying under it keeps every warning whole.
MAX_WARNING = 256
MAX_WARNINGS = 8


def review(api_version: str, response: Response) -> Review:
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def allowed(
    uid: str,
    *,
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
) -> Response:
    response: Response = {"uid": uid, "allowed": True}
    _decorate(response, warnings, audit)
    return response


def patched(
    uid: str,
    patch_json: str,
    *,
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
) -> Response:
    """Allowed, with a JSON Patch (its JSON text; "" for none)."""
    response = allowed(uid, warnings=warnings, audit=audit)
    if patch_json:
        response["patchType"] = "JSONPatch"
        response["patch"] = patching.encode(patch_json)
    return response


def denied(
    uid: str,
    message: str,
    *,
    code: int = 403,
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
) -> Response:
    reason = "Forbidden" if code == 403 else "BadRequest" if code == 400 else "InternalError"
    response: Response = {
        "uid": uid,
        "allowed": False,
        "status": {"code": code, "message": message, "reason": reason},
    }
    _decorate(response, warnings, audit)
    return response


def errored(uid: str, message: str) -> Response:
    """An internal failure as a denial (never HTTP 500): refused under any failurePolicy."""
    return denied(uid, f"gpushare-webhook internal error: {message}", code=500)


def _decorate(response: Response, warnings: Sequence[str], audit: Mapping[str, str] | None) -> None:
    if warnings:
        response["warnings"] = [
            w if len(w) <= MAX_WARNING else w[: MAX_WARNING - 3] + "..."
            for w in warnings[:MAX_WARNINGS]
        ]
    if audit:
        response["auditAnnotations"] = dict(audit)
