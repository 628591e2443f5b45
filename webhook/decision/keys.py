"""How the policy's keys are declared, checked, read and shown: the machinery of one table.

Owns :func:`setting` (a key with a default, a check and a line of
documentation), :func:`section` (a mapping of keys declared by a dataclass)
and :func:`by_name` (a mapping from names, such as namespaces, to sections),
the checks a value passes, and the three things made from the declarations:
a dataclass from a YAML document (:func:`build`), the document back
(:func:`document`) and the documented lines ``policy show`` prints
(:func:`lines`). What the keys are is ``webhook.decision.policy``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, fields
from dataclasses import field as dataclass_field
from typing import Any, Generic, Literal, TypeVar, cast

import yaml

from webhook.errors import PolicyError

S = TypeVar("S")
DNS_LABELS = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
# An image reference: [registry[:port]/]path[:tag][@sha256:digest], lower-case path.
IMAGE = re.compile(r"[a-z0-9][A-Za-z0-9._:/-]{0,254}[A-Za-z0-9_](@sha256:[0-9a-f]{64})?")
ComputeDefault = Literal["none", "proportional"] | int


class Check:
    """What a policy value must be: called with the dotted key and the value, a check
    returns the value as the policy holds it, or raises a PolicyError naming the key.

    Checks are small objects, not closures, so that what they accept can also be
    given as JSON Schema (:meth:`schema`, for the Helm chart's values.schema.json).
    """

    def __call__(self, key: str, value: Any) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class String(Check):
    pattern: re.Pattern[str] | None
    hint: str  # what is expected, for the message: "a namespace name"

    def __call__(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise PolicyError(
                f"policy key {key!r}: expected a non-empty string ({self.hint}), got {value!r}"
            )
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise PolicyError(f"policy key {key!r}: {value!r} is not valid; expected {self.hint}")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # a YAML escape such as "\ud800"
                raise PolicyError(
                    f"policy key {key!r}: {value!r} holds a lone UTF-16 surrogate, which no "
                    "file name or Kubernetes object can hold; write the characters themselves"
                ) from None
        return value

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string", "minLength": 1}
        if self.pattern is not None:
            schema["pattern"] = f"^(?:{self.pattern.pattern})$"
        return schema


@dataclass(frozen=True)
class AbsolutePath(Check):
    def __call__(self, key: str, value: Any) -> str:
        path = String(None, "an absolute path")(key, value)
        if "\x00" in path:
            raise PolicyError(f"policy key {key!r}: {path!r} holds a NUL byte; no path can")
        if not path.startswith("/") or ".." in path.split("/"):
            raise PolicyError(f"policy key {key!r}: {path!r} must be an absolute path without '..'")
        return path

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": "^/"}


@dataclass(frozen=True)
class Folder(AbsolutePath):
    """An absolute path that is not the root: a folder to mount, on the node or in a container."""

    def __call__(self, key: str, value: Any) -> str:
        path = super().__call__(key, value)
        if not path.strip("/"):
            raise PolicyError(
                f"policy key {key!r}: {path!r} is the whole file system; "
                "use a folder of its own, such as /usr/local/vgpu"
            )
        return path

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": "^/.*[^/]"}


@dataclass(frozen=True)
class OrEmpty(Check):
    """``check``, or the empty string for "none"."""

    check: Check

    def __call__(self, key: str, value: Any) -> Any:
        return value if value == "" else self.check(key, value)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [{"const": ""}, self.check.schema()]}


@dataclass(frozen=True)
class FileName(Check):
    def __call__(self, key: str, value: Any) -> str:
        name = String(None, "a file name such as libvgpu.so")(key, value)
        if "/" in name or name in {".", ".."} or any(c in name for c in " :\x00"):
            raise PolicyError(
                f"policy key {key!r}: {name!r} must be a bare file name (no '/', ':' or spaces); "
                "the directory is shim.mountPath"
            )
        return name

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": "^[^/: ]+$"}


@dataclass(frozen=True)
class PositiveInt(Check):
    limit: int

    def __call__(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyError(
                f"policy key {key!r}: expected a positive whole number, got {value!r}"
            )
        if value > self.limit:
            raise PolicyError(f"policy key {key!r}: {value} is too large (at most {self.limit})")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": 1, "maximum": self.limit}


@dataclass(frozen=True)
class Boolean(Check):
    def __call__(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise PolicyError(f"policy key {key!r}: expected true or false, got {value!r}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Choice(Check):
    allowed: tuple[str, ...]

    def __call__(self, key: str, value: Any) -> str:
        if value not in self.allowed:
            raise PolicyError(
                f"policy key {key!r}: {value!r} is not allowed; "
                f"use one of {', '.join(self.allowed)}"
            )
        return cast(str, value)

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.allowed)}


@dataclass(frozen=True)
class ComputeDefaultCheck(Check):
    def __call__(self, key: str, value: Any) -> ComputeDefault:
        if value in ("none", "proportional"):
            return cast(ComputeDefault, value)
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100:
            return value
        raise PolicyError(
            f"policy key {key!r}: {value!r} is not allowed; use none, proportional, "
            "or a whole percentage from 1 to 100"
        )

    def schema(self) -> dict[str, Any]:
        return {
            "anyOf": [
                {"enum": ["none", "proportional"]},
                {"type": "integer", "minimum": 1, "maximum": 100},
            ]
        }


NAMESPACE = String(DNS_LABELS, "a namespace name")


@dataclass(frozen=True)
class NamespaceList(Check):
    def __call__(self, key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise PolicyError(
                f"policy key {key!r}: expected a list of namespace names, got {value!r}"
            )
        return tuple(NAMESPACE(f"{key}[{i}]", item) for i, item in enumerate(value))

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": NAMESPACE.schema()}


@dataclass(frozen=True)
class Named(Generic[S]):
    """A mapping from names to sections, sorted by name (equal policies compare equal)."""

    items: tuple[tuple[str, S], ...] = ()

    def get(self, name: str) -> S | None:
        for each, value in self.items:
            if each == name:
                return value
        return None


# What follows runs once, at import, while the policy's dataclasses are declared;
# tests/test_policy.py pins what it makes (docs/mutation.md).
# pragma: no mutate start
def setting(key: str, default: Any, check: Check, doc: str) -> Any:
    """A policy key: its YAML name, default, check and one line for ``policy show``."""
    return dataclass_field(default=default, metadata={"key": key, "check": check, "doc": doc})


def section(key: str, kind: type, doc: str) -> Any:
    """A mapping of keys, declared by the dataclass ``kind``."""
    return dataclass_field(default_factory=kind, metadata={"key": key, "section": kind, "doc": doc})


def by_name(key: str, kind: type, doc: str, *, name: Check) -> Any:
    """A mapping from names (each passing ``name``) to sections declared by ``kind``."""
    return dataclass_field(
        default_factory=Named, metadata={"key": key, "by_name": kind, "name": name, "doc": doc}
    )


# pragma: no mutate end


def keys_of(kind: type) -> dict[str, Field[Any]]:
    return {spec.metadata["key"]: spec for spec in fields(kind)}


def build(kind: type, values: Mapping[Any, Any], prefix: str) -> Any:
    """An instance of ``kind`` from a YAML mapping; a PolicyError names the key at fault."""
    specs = keys_of(kind)
    made: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        spec = specs.get(key)
        if spec is None:
            raise PolicyError(
                f"policy key {dotted!r} is not known; allowed keys here: {', '.join(specs)}"
            )
        inner = spec.metadata.get("section") or spec.metadata.get("by_name")
        if inner is None:
            made[spec.name] = spec.metadata["check"](dotted, value)
        elif not isinstance(value, dict):
            raise PolicyError(
                f"policy key {dotted!r}: expected a mapping "
                + (
                    f"with keys {', '.join(keys_of(inner))}"
                    if "section" in spec.metadata
                    else f"from names to {{{', '.join(keys_of(inner))}}}"
                )
                + f", got {value!r}"
            )
        elif "section" in spec.metadata:
            made[spec.name] = build(inner, value, f"{dotted}.")
        else:
            made[spec.name] = _named(spec, inner, value, dotted)
    return kind(**made)


def _named(spec: Field[Any], kind: type, values: dict[Any, Any], dotted: str) -> Named[Any]:
    found = []
    for name, settings in values.items():
        spec.metadata["name"](f"{dotted}.{name}", name)
        if not isinstance(settings, dict):
            raise PolicyError(
                f"policy key '{dotted}.{name}': expected a mapping with keys "
                f"{', '.join(keys_of(kind))}, got {settings!r}"
            )
        found.append((name, build(kind, settings, f"{dotted}.{name}.")))
    return Named(tuple(sorted(found)))


def document(settings: Any) -> dict[str, Any]:
    """The YAML document of a dataclass of settings (camelCase keys)."""
    out: dict[str, Any] = {}
    for spec in fields(settings):
        value = getattr(settings, spec.name)
        if "section" in spec.metadata:
            value = document(value)
        elif "by_name" in spec.metadata:
            value = {name: document(each) for name, each in cast(Named[Any], value).items}
        elif isinstance(value, tuple):
            value = list(value)
        out[spec.metadata["key"]] = value
    return out


def lines(settings: Any, indent: str = "") -> Iterator[tuple[str, str]]:
    """(YAML line, its documentation) for every key of a dataclass of settings."""
    for spec in fields(settings):
        key, doc = spec.metadata["key"], spec.metadata["doc"]
        value = getattr(settings, spec.name)
        if "section" in spec.metadata:
            yield f"{indent}{key}:", doc
            yield from lines(value, indent + "  ")
        elif "by_name" in spec.metadata and value.items:
            yield f"{indent}{key}:", doc
            for name, each in value.items:
                yield f"{indent}  {name}:", ""
                yield from lines(each, indent + "    ")
        elif "by_name" in spec.metadata:
            yield f"{indent}{key}: {{}}", doc
        else:
            text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20)
            yield f"{indent}{key}: {text.removesuffix(chr(10)).removesuffix(chr(10) + '...')}", doc


def json_schema(kind: type) -> dict[str, Any]:
    """The JSON Schema of a dataclass of settings: every key, its check and its documentation."""
    properties: dict[str, Any] = {}
    for spec in fields(kind):
        doc = spec.metadata["doc"]
        if "section" in spec.metadata:
            found = json_schema(spec.metadata["section"])
        elif "by_name" in spec.metadata:
            found = {
                "type": "object",
                "propertyNames": spec.metadata["name"].schema(),
                "additionalProperties": json_schema(spec.metadata["by_name"]),
            }
        else:
            found = spec.metadata["check"].schema()
            default = spec.default
            found["default"] = list(default) if isinstance(default, tuple) else default
        properties[spec.metadata["key"]] = {"description": doc, **found}
    return {"type": "object", "additionalProperties": False, "properties": properties}
