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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import Field, dataclass, fields
from dataclasses import field as dataclass_field
from typing import Any, Generic, TypeVar, cast

import yaml

from webhook.errors import PolicyError

Check = Callable[[str, Any], Any]
S = TypeVar("S")
DNS_LABELS = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
# What each check accepts, as JSON Schema (for the Helm chart's values.schema.json).
_SCHEMAS: dict[Check, dict[str, Any]] = {}


def described(check: Check, schema: dict[str, Any]) -> Check:
    """``check``, with the JSON Schema of what it accepts (see :func:`json_schema`)."""
    _SCHEMAS[check] = schema
    return check


def string(pattern: re.Pattern[str] | None, hint: str) -> Check:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise PolicyError(
                f"policy key {key!r}: expected a non-empty string ({hint}), got {value!r}"
            )
        if pattern is not None and not pattern.fullmatch(value):
            raise PolicyError(f"policy key {key!r}: {value!r} is not valid; expected {hint}")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # a YAML escape such as "\ud800"
                raise PolicyError(
                    f"policy key {key!r}: {value!r} holds a lone UTF-16 surrogate, which no "
                    "file name or Kubernetes object can hold; write the characters themselves"
                ) from None
        return value

    schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if pattern is not None:
        schema["pattern"] = f"^(?:{pattern.pattern})$"
    return described(check, schema)


def absolute_path(key: str, value: Any) -> str:
    path = str(string(None, "an absolute path")(key, value))
    if not path.startswith("/") or "\x00" in path or ".." in path.split("/"):
        raise PolicyError(f"policy key {key!r}: {path!r} must be an absolute path without '..'")
    return path


def optional(check: Check) -> Check:
    """``check``, or the empty string for "none"."""

    def optional(key: str, value: Any) -> Any:
        return value if value == "" else check(key, value)

    return described(optional, {"anyOf": [{"const": ""}, _SCHEMAS[check]]})


def file_name(key: str, value: Any) -> str:
    name = str(string(None, "a file name such as libvgpu.so")(key, value))
    if "/" in name or name in {".", ".."} or any(c in name for c in " :\x00"):
        raise PolicyError(
            f"policy key {key!r}: {name!r} must be a bare file name (no '/', ':' or spaces); "
            "the directory is shim.mountPath"
        )
    return name


def positive_int(limit: int | None = None) -> Check:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyError(
                f"policy key {key!r}: expected a positive whole number, got {value!r}"
            )
        if limit is not None and value > limit:
            raise PolicyError(f"policy key {key!r}: {value} is too large (at most {limit})")
        return value

    schema: dict[str, Any] = {"type": "integer", "minimum": 1}
    if limit is not None:
        schema["maximum"] = limit
    return described(check, schema)


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"policy key {key!r}: expected true or false, got {value!r}")
    return value


def choice(*allowed: str) -> Check:
    def check(key: str, value: Any) -> str:
        if value not in allowed:
            raise PolicyError(
                f"policy key {key!r}: {value!r} is not allowed; use one of {', '.join(allowed)}"
            )
        return cast(str, value)

    return described(check, {"enum": list(allowed)})


def namespace_list(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"policy key {key!r}: expected a list of namespace names, got {value!r}")
    check = string(DNS_LABELS, "a namespace name")
    return tuple(check(f"{key}[{i}]", item) for i, item in enumerate(value))


described(absolute_path, {"type": "string", "pattern": "^/"})
described(file_name, {"type": "string", "pattern": "^[^/: ]+$"})
described(boolean, {"type": "boolean"})
described(namespace_list, {"type": "array", "items": _SCHEMAS[string(DNS_LABELS, "")]})


def setting(key: str, default: Any, check: Check, doc: str) -> Any:
    """A policy key: its YAML name, default, check and one line for ``policy show``."""
    return dataclass_field(default=default, metadata={"key": key, "check": check, "doc": doc})


def section(key: str, kind: type, doc: str) -> Any:
    """A mapping of keys, declared by the dataclass ``kind``."""
    return dataclass_field(default_factory=kind, metadata={"key": key, "section": kind, "doc": doc})


@dataclass(frozen=True)
class Named(Generic[S]):
    """A mapping from names to sections, sorted by name (equal policies compare equal)."""

    items: tuple[tuple[str, S], ...] = ()

    def get(self, name: str) -> S | None:
        for each, value in self.items:
            if each == name:
                return value
        return None


def by_name(key: str, kind: type, doc: str, *, name: Check) -> Any:
    """A mapping from names (each passing ``name``) to sections declared by ``kind``."""
    return dataclass_field(
        default_factory=Named, metadata={"key": key, "by_name": kind, "name": name, "doc": doc}
    )


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
            plain = list(value) if isinstance(value, tuple) else value
            text = yaml.safe_dump(plain, default_flow_style=True, width=1 << 20)
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
                "propertyNames": _SCHEMAS[spec.metadata["name"]],
                "additionalProperties": json_schema(spec.metadata["by_name"]),
            }
        else:
            found = dict(_SCHEMAS[spec.metadata["check"]])
            default = spec.default
            found["default"] = list(default) if isinstance(default, tuple) else default
        properties[spec.metadata["key"]] = {"description": doc, **found}
    return {"type": "object", "additionalProperties": False, "properties": properties}
