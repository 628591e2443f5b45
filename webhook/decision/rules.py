"""The rules a GPU pod is held to, registered in one place, and the problems they find.

Owns the registry: each rule is one :class:`Rule`, named by its
``Reason``, with what it looks at (the pod, its containers, the ephemeral
containers ``kubectl debug`` adds), whether a pod that breaks it can still
be set up under ``enforcement: warn``, and the HTTP code of its refusal.
``RULES`` lists them in order of precedence: a pod's problems are told in
the pod's own order, and the one whose rule comes first here names the
refusal (its reason, for the audit annotation and the metric, and its
HTTP code); ``NOT_INJECTABLE`` is read from it too. The
checks (``checks``, ``fit``, ``asks``) find :class:`Problem` values, each
naming its rule's reason, the field and the fix, and append them to the
list they are handed: a pod's author hears every problem in one answer.

A new rule is one entry here, its check where its fields are read, and
one rule case in tests/rules (tests/test_rules.py holds every rule to a
case).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from webhook.errors import PodError, shape_message
from webhook.reasons import Reason


class Looks(StrEnum):
    """What of the pod a rule reads."""

    POD = "pod"  # its spec or metadata
    CONTAINER = "container"  # each app and init container
    EPHEMERAL = "ephemeral container"  # each container added to a running pod


_POD = frozenset({Looks.POD})
_CONTAINER = frozenset({Looks.CONTAINER})
_ALL_CONTAINERS = frozenset({Looks.CONTAINER, Looks.EPHEMERAL})


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: its label, what it reads, and what breaking it does to the set-up.

    ``stops_setup``: under warn, a pod that breaks it is admitted as it
    came, because the set-up would meet what the rule found (a name or path
    of the pod's that the shim's volume or mounts would clash with, an
    LD_PRELOAD the webhook cannot read, a field it cannot read). Breaking
    any other rule leaves the set-up well defined, so it is made.
    """

    reason: Reason
    looks_at: frozenset[Looks]
    summary: str  # what it refuses, for the docs and a reader of this table
    stops_setup: bool = False
    code: int = 403  # the refusal's HTTP code


# In order of precedence: a pod that cannot be read at all, where it may run,
# how it could reach the GPUs around the shim, what it asks, and what of it
# the set-up would meet.
RULES: tuple[Rule, ...] = (
    Rule(
        Reason.MALFORMED_OBJECT,
        frozenset({Looks.POD, *_ALL_CONTAINERS}),
        "a field of the wrong JSON type",
        stops_setup=True,
        code=400,
    ),
    Rule(Reason.NODE_NAME, _POD, "spec.nodeName set: the GPU-share scheduler is skipped"),
    Rule(Reason.SCHEDULER_NAME, _POD, "another scheduler than the GPU-share one"),
    Rule(Reason.HOST_PID, _POD, "the node's process namespace"),
    Rule(Reason.PRIVILEGED, _ALL_CONTAINERS, "a privileged container"),
    Rule(Reason.SYS_ADMIN, _ALL_CONTAINERS, "an admin capability added"),
    Rule(Reason.VISIBLE_DEVICES, _ALL_CONTAINERS, "NVIDIA_VISIBLE_DEVICES set by the pod"),
    Rule(Reason.COUNT_AS_LABEL, _POD, "the GPU count as a label, where it is a resource"),
    Rule(Reason.MULTI_GPU_UNSUPPORTED, _POD, "more than one GPU, where one is all"),
    Rule(Reason.BAD_QUANTITY, _CONTAINER, "a GPU quantity that cannot be read"),
    Rule(Reason.UNIT_CONFUSION, _CONTAINER, "a byte suffix on a count of units"),
    Rule(Reason.NON_POSITIVE, _CONTAINER, "a GPU quantity of zero or less"),
    Rule(Reason.FRACTIONAL, _CONTAINER, "a fractional GPU quantity"),
    Rule(Reason.OUT_OF_RANGE, _CONTAINER, "a GPU quantity past what is counted"),
    Rule(Reason.REQUEST_WITHOUT_LIMIT, _CONTAINER, "a GPU request with no limit"),
    Rule(Reason.REQUEST_DIFFERS, _CONTAINER, "a GPU request unlike its limit"),
    Rule(Reason.COUNT_AS_RESOURCE, _CONTAINER, "the GPU count as a resource, where a label"),
    Rule(Reason.SHARE_WITHOUT_MEMORY, _CONTAINER, "a compute share or GPUs, no memory"),
    Rule(Reason.UNEVEN_SPLIT, _CONTAINER, "memory that does not split over its GPUs"),
    Rule(Reason.EXCEEDS_GPU, _CONTAINER, "more memory than the largest GPU"),
    Rule(Reason.TOO_MANY_GPUS, _CONTAINER, "more GPUs than the largest GPU node"),
    Rule(Reason.INIT_EXCEEDS_RESERVATION, _CONTAINER, "an init container over the hold"),
    Rule(Reason.OFF_GRID, _CONTAINER, "memory a published GPU would round up (DRA)"),
    Rule(Reason.EXCEEDS_COMPUTE, _POD, "compute shares over 100%"),
    Rule(Reason.RESERVED_VOLUME, _POD, "a volume named as ours", stops_setup=True),
    Rule(Reason.SHIM_HOST_PATH, _POD, "a volume of the shim's host path"),
    Rule(Reason.PRELOAD_VALUE_FROM, _CONTAINER, "LD_PRELOAD from valueFrom", stops_setup=True),
    Rule(Reason.SHIM_MOUNT, _CONTAINER, "a mount that meets ours", stops_setup=True),
)
BY_REASON: Mapping[Reason, Rule] = {rule.reason: rule for rule in RULES}
_RANK = {rule.reason: place for place, rule in enumerate(RULES)}


NOT_INJECTABLE = frozenset(rule.reason for rule in RULES if rule.stops_setup)


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason a pod is refused: its rule's label, the field, and the message naming the fix.

    ``path`` is the field where the problem is, where the message is about
    one field's shape (spec.volumes[0]), else empty.
    """

    reason: Reason
    message: str
    path: str = ""

    @property
    def code(self) -> int:
        return BY_REASON[self.reason].code


Problems = list[Problem]  # what the checks found, in the order of the pod's fields


def first(found: Problems) -> Problem:
    """The problem that names a refusal: the one whose rule comes first in ``RULES``."""
    return min(found, key=lambda problem: _RANK[problem.reason])


def problem_of(error: PodError) -> Problem:
    """The problem a parse error stands for (a quantity or a field that cannot be read)."""
    return Problem(error.reason, str(error), getattr(error, "path", ""))


def misshapen(path: str, expected: str, got: object) -> Problem:
    """A field of the wrong JSON type: ``spec.volumes: expected a list, got an object``."""
    return Problem(Reason.MALFORMED_OBJECT, shape_message(path, expected, got), path)
