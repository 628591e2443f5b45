"""A policy made ready for reviews, with the GPU nodes it bounds pods by: the one memo.

Owns what a review needs that depends only on the policy and the node
list: the layout the shim section gives (``layout``), the bounds the
policy sets, the GPU nodes with the note that says why none are known,
and the one memo of the decision. What also depends on a pod (the
variables pinned for an ask, the status text, LD_PRELOAD with the shim
first, the bounds of a placement) repeats across the pods of a workload,
so it is kept here the first time, under a key its user chooses. The
memo lives and dies with this object: a new policy, or a new node list,
makes a new :class:`Prepared` (``webhook.decision.nodesource.NodeSource``), so
nothing kept can outlive what it was made from.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

from webhook.decision.capacity import (
    GpuBounds,
    GpuNode,
    bounds_from_policy,
    bounds_over,
    placement_key,
)
from webhook.decision.layout import Layout, layout_of
from webhook.decision.policy import Policy

T = TypeVar("T")


class Prepared:
    """``policy`` and the GPU nodes a review is checked against (None: the policy's sizes).

    ``note`` says why the policy's sizes are used although nodes were asked
    for; it becomes an AdmissionResponse warning on GPU pods.
    """

    MEMO_KEPT = 4096  # values kept at once: a bound, not an eviction policy (refilling is cheap)

    def __init__(
        self,
        policy: Policy,
        nodes: Sequence[GpuNode] | None = None,
        note: str = "",
        *,
        uncounted: Sequence[str] = (),
    ) -> None:
        self.policy = policy
        self.nodes: tuple[GpuNode, ...] | None = tuple(nodes) if nodes else None
        self.note = note
        # Nodes that report GPU memory but no GPU count: the scheduler counts
        # no GPU there, so they bound no pod (the node watch logs them).
        self.uncounted = tuple(uncounted)
        self.layout: Layout = layout_of(policy)
        self.policy_bounds: GpuBounds = bounds_from_policy(policy)
        # Under scheduler: dra, the request policies ((min, step) in bytes) of the
        # published GPUs' memory; an ask on none of them is refused (claims.on_grid).
        self.grids: tuple[tuple[int, int], ...] = ()
        # (class, resource) of each DeviceClass that maps one of the policy's
        # resources to whole devices (KEP-5004).
        self.mapped: tuple[tuple[str, str], ...] = ()
        self._memo: dict[Hashable, Any] = {}

    def remember(self, key: Hashable, make: Callable[[], T]) -> T:
        """What ``make()`` returns, made the first time ``key`` is asked for.

        The key names what is kept (its first item, by convention the
        function that makes it) and everything it is made from besides the
        policy and the nodes.
        """
        memo = self._memo
        if key in memo:
            return memo[key]  # type: ignore[no-any-return]
        if len(memo) >= self.MEMO_KEPT:
            memo.clear()
        found = memo[key] = make()
        return found

    def bounds(self, spec: Mapping[str, Any]) -> GpuBounds:
        """The bounds for a pod with this spec: the largest GPU it may be placed on.

        Working them out passes over every GPU node (about 1 ms for 500),
        and pods share placements (most have none): kept per placement.
        """
        nodes = self.nodes
        if nodes is None:
            return self.policy_bounds
        return self.remember(
            (bounds_over, placement_key(spec)), lambda: bounds_over(spec, nodes, self.policy)
        )


class Kept:
    """The one :class:`Prepared` in force, made again when the policy or the node list changes.

    Its identity rule is the only one: the same policy object and the same
    node list object (a snapshot, or None without nodes) give the same
    Prepared, and with it everything its memo kept.
    """

    def __init__(self) -> None:
        self._made: tuple[object, Prepared] | None = None  # (the node list, its Prepared)

    @property
    def last(self) -> Prepared | None:
        return None if self._made is None else self._made[1]

    def get(self, policy: Policy, nodes: object, make: Callable[[], Prepared]) -> Prepared:
        made = self._made
        if made is not None and made[0] is nodes and made[1].policy is policy:
            return made[1]
        prepared = make()
        self._made = (nodes, prepared)
        return prepared
