"""What the guard refused, as the cluster's events tell it.

A pod the guard refuses is never stored, so a report cannot judge it; but
a controller that tried to make it (a ReplicaSet, a Job, a StatefulSet, a
DaemonSet) records a ``FailedCreate`` event carrying the API server's
refusal, and with it the guard's words. Owns finding those events and
keeping, per controller, the latest. A pod created by hand leaves no event:
its refusal is in the audit log only (``gpushare-webhook-guard/refused``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.decision import MESSAGE_PREFIX

REASON = "FailedCreate"  # what controllers record when a pod create is refused


@dataclass(frozen=True)
class Refused:
    """A controller whose pods the guard refused: the webhook was bypassed for them."""

    namespace: str
    kind: str
    name: str
    count: int  # refusals the event counted
    last: str  # when the last one was, as the event says ("" when it does not)
    message: str  # the guard's words, from its prefix on


def refused(events: Iterable[Mapping[str, Any]]) -> tuple[Refused, ...]:
    """The controllers the guard refused pods of, sorted, each with its latest refusal."""
    latest: dict[tuple[str, str, str], Refused] = {}
    for event in events:
        message = event.get("message")
        if event.get("reason") != REASON or not isinstance(message, str):
            continue
        _, mark, words = message.partition(MESSAGE_PREFIX)
        if not mark:
            continue
        about = event.get("involvedObject") or {}
        found = Refused(
            namespace=str(about.get("namespace") or event["metadata"].get("namespace", "")),
            kind=str(about.get("kind", "")),
            name=str(about.get("name", "")),
            count=_count(event),
            last=str(event.get("lastTimestamp") or event.get("eventTime") or ""),
            message=mark + words,
        )
        key = (found.namespace, found.kind, found.name)
        if key not in latest or found.last >= latest[key].last:
            latest[key] = found
    return tuple(latest[key] for key in sorted(latest))


def _count(event: Mapping[str, Any]) -> int:
    series = event.get("series")
    counted = series.get("count") if isinstance(series, Mapping) else event.get("count")
    return counted if isinstance(counted, int) and counted > 0 else 1
