"""Reading a pod's fields: the shapes the decision relies on, and how messages name containers.

Owns the few walks every rule shares (the containers of a spec, an object
or list field that must have that shape) and the words a message uses for
a container. A field of the wrong shape is a :class:`ShapeError` naming
its path; an absent optional one reads as empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.errors import ShapeError

# What the webhook records on each pod it sets up (the limits it pinned), read back by
# the report, top and the node agent.
STATUS_ANNOTATION = "gpushare-webhook.io/status"

CONTAINER_KINDS = ("initContainers", "containers")
EMPTY: Mapping[str, Any] = {}  # never handed out to be changed

_KIND_WORDS = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}


def asks_resource(
    container: object, names: tuple[str, ...], sections: tuple[str, ...] = ("limits", "requests")
) -> bool:
    """Whether the container names one of ``names`` in its resources (in ``sections`` of them).

    The one answer to "does this container ask for X": the pod's selection
    (``plan.is_gpu_pod``), the rules and ``report`` all ask it here.
    """
    resources = container.get("resources") if isinstance(container, dict) else None
    if not isinstance(resources, dict):
        return False
    for section in sections:
        values = resources.get(section)
        if isinstance(values, dict):
            for name in names:
                if name in values:
                    return True
    return False


def container_label(kind: str, name: object) -> str:
    """How messages name a container: "container 'main'" or "init container 'fetch'"."""
    return f"{_KIND_WORDS.get(kind, 'container')} {name!r}"


def label(kind: str, container: Mapping[str, Any]) -> str:
    # Labels and field paths are built only when a message needs them:
    # on the accepted path they would cost more than the checks themselves.
    return container_label(kind, container.get("name"))


def mapping(parent: Mapping[str, Any], key: str, *, path: str, optional: bool) -> Any:
    """``parent[key]``, which must be an object (or absent, when ``optional``: then empty)."""
    value = parent.get(key)
    if value is None and optional:
        return EMPTY
    if not isinstance(value, dict):
        raise ShapeError(f"{path}.{key}" if path else key, "an object", value)
    return value


def listed(parent: Mapping[str, Any], key: str, path: str) -> list[Any]:
    """``parent[key]``, which must be a list when present ([] when absent)."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ShapeError(f"{path}.{key}", "a list", value)
    return value


def containers(spec: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    """(kind, index, container) of every init and app container; each must be an object."""
    found: list[tuple[str, int, Mapping[str, Any]]] = []
    for kind in CONTAINER_KINDS:
        for index, container in enumerate(listed(spec, kind, "spec")):
            if not isinstance(container, dict):
                raise ShapeError(f"spec.{kind}[{index}]", "a container object", container)
            found.append((kind, index, container))
    return found


def each_container(
    spec: Mapping[str, Any], kinds: tuple[str, ...]
) -> list[tuple[str, Mapping[str, Any]]]:
    """Containers of ``kinds``, skipping malformed entries (reported elsewhere, if ours)."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    for kind in kinds:
        entries = spec.get(kind)
        if isinstance(entries, list):
            found += [(kind, c) for c in entries if isinstance(c, dict)]
    return found
