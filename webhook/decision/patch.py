"""RFC 6902 JSON Patch operations, written as JSON text while the decision is made.

Owns JSON-Pointer escaping, the few operation shapes the webhook emits and
how they are written. Building ops from what the planner decided costs
microseconds; diffing whole pods with ``jsonpatch.make_patch`` costs about
a millisecond per review and can emit moves and copies that are harder to
audit.

NB: the patch is written as text, op by op, not built as dicts and then
encoded: the json module spends about a microsecond on every op of a list
(more than the planner spends deciding it), while most of an op's text is
known in advance (the shim's mount and volume are the same for every pod)
and the rest is a few names and values to quote. :class:`Writer` is the one
place that text is made; ``Decision.patch`` reads it back as ops.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal, NotRequired, TypedDict

# NB: everything the webhook writes as JSON is ASCII, with the rest escaped:
# a review (its uid, a value the patch carries) or a policy may hold a lone
# surrogate (written "\ud800"), which has no UTF-8 form; escaped, it goes
# back to the apiserver as it came. (ASCII output is no slower to make.)
# What is encoded is trees built from parsed JSON, which have no cycles to
# look for; the search costs a fifth of encoding a patch. Built once:
# json.dumps with options makes a new encoder on every call.
compact_json = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
sorted_ascii_json = json.JSONEncoder(
    separators=(",", ":"), check_circular=False, sort_keys=True
).encode
string = json.encoder.encode_basestring_ascii  # a JSON string literal, quotes included


class Op(TypedDict):
    op: Literal["add", "replace", "remove"]
    path: str
    value: NotRequired[Any]  # every op but "remove"


def escape(token: str) -> str:
    """Escape one JSON-Pointer reference token (RFC 6901, section 4)."""
    return token.replace("~", "~0").replace("/", "~1")


def env_entry(name: str, value: str) -> str:
    """``{"name": name, "value": value}`` as JSON text."""
    return f'{{"name":{string(name)},"value":{string(value)}}}'


def array(items: list[str]) -> str:
    """A JSON array of values already written as JSON text."""
    return f"[{','.join(items)}]"


class Writer:
    """A JSON Patch, op by op; every value is given as its JSON text."""

    __slots__ = ("ops",)

    def __init__(self) -> None:
        self.ops: list[str] = []

    def __len__(self) -> int:
        return len(self.ops)

    def add(self, path: str, value: str) -> None:
        self.ops.append(f'{{"op":"add","path":{string(path)},"value":{value}}}')

    def replace(self, path: str, value: str) -> None:
        self.ops.append(f'{{"op":"replace","path":{string(path)},"value":{value}}}')

    def remove(self, path: str) -> None:
        self.ops.append(f'{{"op":"remove","path":{string(path)}}}')

    def set_field(self, parent: dict[str, Any] | Any, key: str, base: str, value: str) -> None:
        """Add ``key`` under ``base``, or replace it if the parent already has it."""
        path = f"{base}/{escape(key)}"
        if key in parent:
            self.replace(path, value)
        else:
            self.add(path, value)

    def text(self) -> str:
        """The patch as a JSON array; "" when there is nothing to change."""
        return array(self.ops) if self.ops else ""


def decode(text: str) -> tuple[Op, ...]:
    """The ops of a patch written by :class:`Writer`."""
    return tuple(json.loads(text)) if text else ()


def encode(text: str) -> str:
    """The patch as the apiserver wants it: base64 of the JSON array."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")
