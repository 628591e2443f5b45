"""RFC 6902 JSON Patch operations, built directly from the decision.

Owns JSON-Pointer escaping and the few operation shapes the webhook emits.
Building ops from what the planner decided costs microseconds; diffing whole
pods with ``jsonpatch.make_patch`` costs about a millisecond per review and
can emit moves and copies that are harder to audit.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict


class Op(TypedDict):
    op: Literal["add", "replace", "remove"]
    path: str
    value: NotRequired[Any]  # every op but "remove"


def escape(token: str) -> str:
    """Escape one JSON-Pointer reference token (RFC 6901, section 4)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join(f"/{escape(str(token))}" for token in tokens)


def add(path: str, value: Any) -> Op:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> Op:
    return {"op": "replace", "path": path, "value": value}


def remove(path: str) -> Op:
    return {"op": "remove", "path": path}


def set_field(parent: dict[str, Any] | Any, key: str, base: str, value: Any) -> Op:
    """Add ``key`` under ``base`` or replace it if the parent already has it."""
    path = f"{base}/{escape(key)}"
    return replace(path, value) if key in parent else add(path, value)


# NB: what the webhook encodes is trees it built from parsed JSON, which have
# no cycles to look for; the search costs a fifth of encoding a patch.
# Built once: json.dumps with options makes a new encoder on every call.
compact_json = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, check_circular=False
).encode
sorted_ascii_json = json.JSONEncoder(
    separators=(",", ":"), check_circular=False, sort_keys=True
).encode


def encode(ops: Sequence[Op]) -> str:
    """The patch as the apiserver wants it: base64 of the JSON array."""
    raw = compact_json(ops if isinstance(ops, list) else list(ops))
    return base64.b64encode(raw.encode("utf-8")).decode("ascii")
