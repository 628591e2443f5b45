"""RFC 6902 JSON Patch operations as data, and the one place they become JSON.

Owns JSON-Pointer escaping, the three operation shapes the webhook emits
(add, replace, remove) and their encoding. Building ops from what the
decision found costs microseconds; diffing whole pods with
``jsonpatch.make_patch`` costs about a millisecond per review and can emit
moves and copies that are harder to audit.

The decision returns ops as :class:`Op` data; :func:`encode` turns them
into the base64 JSON the apiserver wants, once, where the answer is made,
and :func:`plain` into the dicts a JSON Patch library applies.
"""

from __future__ import annotations

import binascii
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from webhook.decision import jsontext

# NB: everything the webhook writes as JSON is ASCII, with the rest escaped:
# a review (its uid, a value the patch carries) or a policy may hold a lone
# surrogate (written "\ud800"), which has no UTF-8 form; escaped, it goes
# back to the apiserver as it came. (ASCII output is no slower to make.)
compact_json = jsontext.compact
_string = jsontext.string  # a JSON string literal, quotes included


class EnvVar(NamedTuple):
    """One ``env`` entry with a plain value."""

    name: str
    value: str


T = TypeVar("T", bound="Mapping[str, Any] | Sequence[Mapping[str, Any]]")


@dataclass(frozen=True, eq=False)
class Fixed(Generic[T]):
    """A value that is the same in every patch of one policy (the shim's volume and mounts).

    Made once per policy layout and shared by every patch, so it must not
    be changed: :func:`plain` hands out copies. Its JSON is made the first
    time a patch holding it is encoded, and kept with it, and so is the
    JSON of each op that carries it: the same few paths (``env/-`` of the
    first containers) come back in every pod.
    """

    data: T
    _ops: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def text(self) -> str:
        return compact_json(self.data)

    def op_text(self, op: str, path: str) -> str:
        """The JSON of one op that carries this value."""
        key = (op, path)
        found = self._ops.get(key)
        if found is None:
            found = f'{{"op":"{op}","path":{_string(path)},"value":{self.text}}}'
            if len(self._ops) < OPS_KEPT:
                self._ops[key] = found
        return found


OPS_KEPT = 64  # op texts kept per value: the paths of the first containers of a pod


Value = str | EnvVar | Fixed[Any] | list[Any] | Mapping[str, Any]


class Op(NamedTuple):
    """One JSON Patch operation; ``value`` is None only for "remove"."""

    op: Literal["add", "replace", "remove"]
    path: str
    value: Value | None = None


def escape(token: str) -> str:
    """Escape one JSON-Pointer reference token (RFC 6901, section 4)."""
    return token.replace("~", "~0").replace("/", "~1")


# NB: made with tuple.__new__, as NamedTuple's own __new__ does, minus its
# Python frame: a pod gets a few ops for every container.
_new = tuple.__new__


def add(path: str, value: Value) -> Op:
    return _new(Op, ("add", path, value))


def replace(path: str, value: Value) -> Op:
    return _new(Op, ("replace", path, value))


def remove(path: str) -> Op:
    return _new(Op, ("remove", path, None))


def set_field(parent: Mapping[str, Any], key: str, base: str, value: Value) -> Op:
    """Add ``key`` under ``base``, or replace it if the parent already has it."""
    path = f"{base}/{escape(key)}"
    return Op("replace" if key in parent else "add", path, value)


# NB: the ops are written here, not by one call of the json encoder over
# dicts: it spends about a microsecond on every op (more than the decision
# spends deciding it), while most of an op's text is a name, a path and a
# value whose JSON is known (a Fixed value's) or two quoted strings.


def _value(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is EnvVar:
        return f'{{"name":{_string(value.name)},"value":{_string(value.value)}}}'
    if kind is Fixed:
        return str(value.text)
    if kind is list:
        return f"[{','.join([_value(item) for item in value])}]"
    return compact_json(value)


def to_json(ops: Sequence[Op]) -> str:
    """The patch as JSON text: an array of ops."""
    return (
        "["
        + ",".join(
            [
                # A Fixed value's op text is nearly always kept already: no call to look it up.
                (value._ops.get((op, path)) or value.op_text(op, path))
                if type(value) is Fixed
                else f'{{"op":"{op}","path":{_string(path)},"value":{_value(value)}}}'
                if op != "remove"
                else f'{{"op":"remove","path":{_string(path)}}}'
                for op, path, value in ops
            ]
        )
        + "]"
    )


def encode(ops: Sequence[Op]) -> str:
    """The patch as the apiserver wants it: base64 of the JSON array."""
    return binascii.b2a_base64(to_json(ops).encode("ascii"), newline=False).decode("ascii")


def plain(ops: Sequence[Op]) -> tuple[dict[str, Any], ...]:
    """The ops as plain JSON data, as a JSON Patch library or a person reads them."""
    return tuple(json.loads(to_json(ops)))
