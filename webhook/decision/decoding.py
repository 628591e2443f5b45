"""Turning an HTTP body into an AdmissionReview request, or a precise ReviewError.

Owns what counts as a well-formed envelope. Anything wrong here is the
caller's fault and is answered with HTTP 400 and the message of the error;
what is wrong *inside* the object is the planner's to judge.
"""

from __future__ import annotations

import json
from typing import cast

from webhook.decision.reviews import API_VERSIONS, Request
from webhook.errors import ReviewError

MAX_UID = 256


def _shown(value: object) -> str:
    return "missing" if value is None else repr(value)


def decode(body: bytes) -> tuple[str, Request]:
    """Return (apiVersion, request) of an AdmissionReview body."""
    if not body:
        raise ReviewError("empty body: expected an AdmissionReview JSON object")
    try:
        # A key given twice is read as json.loads reads it (the last wins):
        # the API server writes each review from its own typed objects and
        # never sends one, so it is not looked for here (its cost: docs/design.md),
        # only where a person's file is read (cli.offline).
        review = json.loads(body)
    except RecursionError:
        raise ReviewError("body is nested too deeply to be an AdmissionReview") from None
    except UnicodeDecodeError:
        raise ReviewError("body is not UTF-8 JSON") from None
    except ValueError as error:
        raise ReviewError(f"body is not valid JSON: {error}") from None
    if not isinstance(review, dict):
        raise ReviewError("body must be a JSON object (an AdmissionReview)")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if kind != "AdmissionReview":
        raise ReviewError(f"kind is {_shown(kind)}; expected 'AdmissionReview'")
    if api_version not in API_VERSIONS:
        raise ReviewError(
            f"apiVersion is {_shown(api_version)}; expected one of {', '.join(API_VERSIONS)}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID:
        raise ReviewError("request.uid must be a non-empty string (it is echoed in the response)")
    gvk = request.get("kind")
    if not isinstance(gvk, dict) or not all(
        isinstance(gvk.get(k), str) for k in ("group", "version", "kind")
    ):
        raise ReviewError("request.kind must be an object with string group, version and kind")
    if not isinstance(request.get("operation"), str):
        raise ReviewError("request.operation must be a string such as 'CREATE'")
    for key in ("namespace", "name", "subResource"):
        if request.get(key) is not None and not isinstance(request.get(key), str):
            raise ReviewError(f"request.{key} must be a string")
    return cast(str, api_version), cast(Request, request)
