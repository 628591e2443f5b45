"""CEL text: the pieces the guard's expressions are written with, as Python that writes CEL.

Owns how a container's ask of a resource is read in CEL (from its limits,
else its requests, as ``webhook.decision.asks`` reads it) and how a list of
(condition, what is missing) pairs becomes one condition and one list of
words. Text only: the API server compiles and runs it.
"""

from __future__ import annotations

import json


def literal(value: str | bool | int) -> str:
    """A CEL literal: JSON's strings, booleans and integers are CEL's too."""
    return json.dumps(value)


# What follows is text made once, at import, and pinned by tests/test_guard.py
# and tests/apiserver (docs/mutation.md).
# pragma: no mutate start
# The pod's containers and init containers, as one list.
CONTAINERS = (
    "(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : []))"
)


def asks(resource: str, c: str = "c") -> str:
    """Container ``c`` asks ``resource`` (a CEL string), in its limits or its requests."""
    return (
        f"has({c}.resources) && ((has({c}.resources.limits) && {resource} in {c}.resources.limits)"
        f" || (has({c}.resources.requests) && {resource} in {c}.resources.requests))"
    )


def ask(resource: str, c: str = "c") -> str:
    """Container ``c``'s ask of ``resource``, an integer: its limit, else its request."""
    return (
        f"quantity(has({c}.resources.limits) && {resource} in {c}.resources.limits ? "
        f"{c}.resources.limits[{resource}] : {c}.resources.requests[{resource}]).asInteger()"
    )


def all_of(pieces: list[tuple[str, str]]) -> str:
    """Every condition of (condition, what is missing) pairs holds."""
    return " && ".join(f"({holds})" for holds, _ in pieces)


def missing(pieces: list[tuple[str, str]]) -> str:
    """A CEL list: for each pair, '' where it holds, else what is missing."""
    return "[" + ", ".join(f"{holds} ? '' : {what}" for holds, what in pieces) + "]"


# pragma: no mutate end
