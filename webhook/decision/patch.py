"""RFC 6902 JSON Patch operations as data.

Owns JSON-Pointer escaping and the three operation shapes the webhook
emits (add, replace, remove). Building ops from what the decision found
costs microseconds; diffing whole pods with ``jsonpatch.make_patch`` costs
about a millisecond per review and can emit moves and copies that are
harder to audit.

The decision returns ops as :class:`Op` values, whose ``value`` is plain
JSON data (the layout's volumes and mounts are shared by every patch of a
policy, so no one may change them). They become text in one place, with
the rest of the answer: ``webhook.decision.responses.encode``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

Kind = Literal["add", "replace", "remove"]


class Op(NamedTuple):
    """One JSON Patch operation; ``value`` is None only for "remove"."""

    op: Kind
    path: str
    value: Any = None

    def as_json(self) -> dict[str, Any]:
        """The op as RFC 6902 writes it (its value shared, not copied)."""
        if self.op == "remove":
            return {"op": "remove", "path": self.path}
        return {"op": self.op, "path": self.path, "value": self.value}


def escape(token: str) -> str:
    """Escape one JSON-Pointer reference token (RFC 6901, section 4)."""
    return token.replace("~", "~0").replace("/", "~1")


def add(path: str, value: Any) -> Op:
    """Add ``value`` (plain JSON) at ``path``."""
    return Op("add", path, value)


def replace(path: str, value: Any) -> Op:
    return Op("replace", path, value)


def remove(path: str) -> Op:
    return Op("remove", path)


def set_field(parent: Mapping[str, Any], key: str, base: str, value: Any) -> Op:
    """Add ``key`` under ``base``, or replace it if the parent already has it."""
    return Op("replace" if key in parent else "add", f"{base}/{escape(key)}", value)


def plain(ops: Sequence[Op]) -> tuple[dict[str, Any], ...]:
    """The ops as JSON data of their own, for a JSON Patch library or a person to keep."""
    return tuple(copy.deepcopy(op.as_json()) for op in ops)
