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
from typing import Any, Literal, TypedDict


class Op(TypedDict):
    op: Literal["add", "replace", "remove"]
    path: str
    value: Any


def escape(token: str) -> str:
    """Escape one JSON-Pointer reference token (RFC 6901, section 4)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join(f"/{escape(str(token))}" for token in tokens)


def add(path: str, value: Any) -> Op:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> Op:
    return {"op": "replace", "path": path, "value": value}


def set_field(parent: dict[str, Any] | Any, key: str, base: str, value: Any) -> Op:
    """Add ``key`` under ``base`` or replace it if the parent already has it."""
    path = f"{base}/{escape(key)}"
    return replace(path, value) if key in parent else add(path, value)


def encode(ops: Sequence[Op]) -> str:
    """The patch as the apiserver wants it: base64 of the JSON array."""
    raw = json.dumps(list(ops), separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(raw.encode("utf-8")).decode("ascii")
