"""AdmissionReview responses: allowed, denied, patched, errored, and their JSON.

Owns the response envelope and the one place it is written as JSON. Every
constructor echoes the request uid and
answers in the apiVersion the request came in (the apiserver rejects a
response in another version).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from webhook.decision import patch
from webhook.decision.jsontext import compact as compact_json
from webhook.decision.jsontext import string
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
        response["patch"] = patch.encode(ops)
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


def encode(review: Review) -> bytes:
    """The review as compact ASCII JSON, written field by field.

    NB: a patch is base64 ([A-Za-z0-9+/=]), which a JSON string holds as
    it is; the json encoder would scan and copy its few KiB one character
    at a time, which costs more than encoding all of the rest of the
    answer. So each field is encoded on its own and the patch is quoted
    as it is: the same text the encoder would make (a test holds them
    equal), for a fifth of the instructions.
    """
    response = review.get("response")
    if response is None or "patch" not in response:
        return compact_json(review).encode("ascii")
    fields = [
        f'"patch":"{value}"'
        if key == "patch"
        else f"{string(key)}:{string(value) if type(value) is str else compact_json(value)}"
        for key, value in response.items()
    ]
    head = f'{{"apiVersion":{string(review["apiVersion"])},"kind":"AdmissionReview"'
    return f'{head},"response":{{{",".join(fields)}}}}}'.encode("ascii")
