"""AdmissionReview responses: allowed, denied, patched, errored, and their JSON.

Owns the response envelope and the one place an answer is written as JSON
(:func:`encode`, with one encoder, its patch included). Every constructor
echoes the request uid and answers in the apiVersion the request came in
(the apiserver rejects a response in another version); ``patched`` keeps
the patch as ops until then.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.decision.jsontext import compact
from webhook.decision.patch import Op
from webhook.decision.reviews import Response, Review

# The API server keeps warnings whole while they add up to 4 KiB, and past
# that cuts every one to 256 characters (apiserver/pkg/endpoints/filters/
# warning.go); other admission plugins may add theirs to the same request,
# so ours stay within 3 KiB in all. It drops a warning with a control
# character in it.
MAX_WARNINGS = 10
MAX_WARNINGS_TEXT = 3072


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
    ops: Sequence[Op],
    *,
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
) -> Response:
    """Allowed, with a JSON Patch of ``ops`` (none: no patch at all)."""
    response = allowed(uid, warnings=warnings, audit=audit)
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = tuple(ops)  # written by encode
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


def errored(uid: str, message: str, *, audit: Mapping[str, str] | None = None) -> Response:
    """An internal failure as a denial (never HTTP 500): refused under any failurePolicy."""
    return denied(uid, f"gpushare-webhook internal error: {message}", code=500, audit=audit)


def _decorate(response: Response, warnings: Sequence[str], audit: Mapping[str, str] | None) -> None:
    if warnings:
        response["warnings"] = _kept_whole(warnings)
    if audit:
        response["auditAnnotations"] = dict(audit)


def _kept_whole(warnings: Sequence[str]) -> list[str]:
    """The warnings, printable, cut only where they pass the room the API server leaves whole."""
    kept: list[str] = []
    room = MAX_WARNINGS_TEXT
    for warning in warnings[:MAX_WARNINGS]:
        text = warning if warning.isprintable() else _printable(warning)
        if len(text) > room:  # room is 4 or more: see the break below
            text = text[: room - 3] + "..."
        kept.append(text)
        room -= len(text)
        if room <= 3:
            break
    return kept


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def encode(review: Mapping[str, Any]) -> bytes:
    """The review (or error) as compact JSON, in ASCII, its patch as the apiserver wants it.

    The patch is the base64 of its ops' JSON. ASCII, with the rest
    escaped: a review's uid or a value the patch carries may hold a lone
    surrogate, which has no UTF-8 form; escaped, it goes back as it came.
    """
    response = review.get("response")
    if response is not None and "patch" in response:
        ops = compact([op.as_json() for op in response["patch"]])
        text = binascii.b2a_base64(ops.encode("ascii"), newline=False).decode("ascii")
        review = {**review, "response": {**response, "patch": text}}
    return compact(review).encode("ascii")
