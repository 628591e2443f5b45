"""The rules a GPU pod is held to, registered in one place, and the problems they find.

Owns the registry: each rule is one :class:`Rule`, named by its
``Reason``, with what it looks at (the pod, its containers, the ephemeral
containers ``kubectl debug`` adds), whether a pod that breaks it can still
be set up under ``enforcement: warn``, and the HTTP code of its refusal.
``RULES`` lists them in the order the decision meets them, so a pod's
problems come in that order; ``NOT_INJECTABLE`` is read from it. The
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


def _rule(reason: Reason, looks: Looks, summary: str, *, stops_setup: bool = False) -> Rule:
    return Rule(reason, frozenset({looks}), summary, stops_setup=stops_setup)


# In the order the decision meets them: where the pod may run, how it could
# reach the GPUs around the shim, what it asks, and what of it the set-up
# would meet.
RULES: tuple[Rule, ...] = (
    _rule(Reason.NODE_NAME, Looks.POD, "spec.nodeName set: the GPU-share scheduler is skipped"),
    _rule(Reason.SCHEDULER_NAME, Looks.POD, "another scheduler than the GPU-share one"),
    _rule(Reason.HOST_PID, Looks.POD, "the node's process namespace"),
    Rule(Reason.PRIVILEGED, _ALL_CONTAINERS, "a privileged container"),
    Rule(Reason.SYS_ADMIN, _ALL_CONTAINERS, "an admin capability added"),
    Rule(Reason.VISIBLE_DEVICES, _ALL_CONTAINERS, "NVIDIA_VISIBLE_DEVICES set by the pod"),
    _rule(Reason.COUNT_AS_LABEL, Looks.POD, "the GPU count as a label, where it is a resource"),
    _rule(Reason.MULTI_GPU_UNSUPPORTED, Looks.POD, "more than one GPU, where one is all"),
    _rule(Reason.BAD_QUANTITY, Looks.CONTAINER, "a GPU quantity that cannot be read"),
    _rule(Reason.UNIT_CONFUSION, Looks.CONTAINER, "a byte suffix on a count of units"),
    _rule(Reason.NON_POSITIVE, Looks.CONTAINER, "a GPU quantity of zero or less"),
    _rule(Reason.FRACTIONAL, Looks.CONTAINER, "a fractional GPU quantity"),
    _rule(Reason.OUT_OF_RANGE, Looks.CONTAINER, "a GPU quantity past what is counted"),
    _rule(Reason.REQUEST_WITHOUT_LIMIT, Looks.CONTAINER, "a GPU request with no limit"),
    _rule(Reason.REQUEST_DIFFERS, Looks.CONTAINER, "a GPU request unlike its limit"),
    _rule(Reason.COUNT_AS_RESOURCE, Looks.CONTAINER, "the GPU count as a resource, where a label"),
    _rule(Reason.SHARE_WITHOUT_MEMORY, Looks.CONTAINER, "a compute share or GPUs, no memory"),
    _rule(Reason.UNEVEN_SPLIT, Looks.CONTAINER, "memory that does not split over its GPUs"),
    _rule(Reason.EXCEEDS_GPU, Looks.CONTAINER, "more memory than the largest GPU"),
    _rule(Reason.TOO_MANY_GPUS, Looks.CONTAINER, "more GPUs than the largest GPU node"),
    _rule(Reason.INIT_EXCEEDS_RESERVATION, Looks.CONTAINER, "an init container over the hold"),
    _rule(Reason.EXCEEDS_COMPUTE, Looks.POD, "compute shares over 100%"),
    _rule(Reason.RESERVED_VOLUME, Looks.POD, "a volume named as ours", stops_setup=True),
    _rule(Reason.SHIM_HOST_PATH, Looks.POD, "a volume of the shim's host path"),
    _rule(
        Reason.PRELOAD_VALUE_FROM, Looks.CONTAINER, "LD_PRELOAD from valueFrom", stops_setup=True
    ),
    _rule(Reason.SHIM_MOUNT, Looks.CONTAINER, "a mount that meets ours", stops_setup=True),
    Rule(
        Reason.MALFORMED_OBJECT,
        frozenset({Looks.POD, *_ALL_CONTAINERS}),
        "a field of the wrong JSON type",
        stops_setup=True,
        code=400,
    ),
)
BY_REASON: Mapping[Reason, Rule] = {rule.reason: rule for rule in RULES}
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


def problem_of(error: PodError) -> Problem:
    """The problem a parse error stands for (a quantity or a field that cannot be read)."""
    return Problem(error.reason, str(error), getattr(error, "path", ""))


def misshapen(path: str, expected: str, got: object) -> Problem:
    """A field of the wrong JSON type: ``spec.volumes: expected a list, got an object``."""
    return Problem(Reason.MALFORMED_OBJECT, shape_message(path, expected, got), path)
