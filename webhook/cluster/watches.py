"""The node watch process's watches, together: Nodes, what ``scheduler: dra`` reads, and pods.

Owns the five list-then-watches of one server (``webhook.cluster.informer``):
the Nodes; the ResourceSlices and DeviceClasses, whose facts go into the
snapshot beside the Nodes'; the pods the webhook gave claims that are not
bound yet, and the claim templates it made, for
``webhook.cluster.templates``. The resource.k8s.io/v1 kinds are optional: a
cluster without them (or RBAC without them) is said once per kind, and
the Nodes go on alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client

from webhook.cluster import informer, templates
from webhook.decision import (
    DeviceFacts,
    DraFacts,
    NodeFacts,
    NodeStatus,
    Policy,
    class_of,
    devices_of,
    mapping_classes,
)

log = logging.getLogger("gpushare_webhook.nodes")
SLICES = informer.Resource(
    "/apis/resource.k8s.io/v1/resourceslices", "resourceslices", "ResourceSlice", informer.RBAC,
    optional=True,
)  # fmt: skip
CLASSES = informer.Resource(
    "/apis/resource.k8s.io/v1/deviceclasses", "deviceclasses", "DeviceClass", informer.RBAC,
    optional=True,
)  # fmt: skip


def mapped_classes(classes: tuple[tuple[str, str], ...], policy: Policy) -> tuple[str, ...]:
    """``class (resource)`` of each DeviceClass that maps one of the policy's resources."""
    return tuple(f"{name} ({resource})" for name, resource in mapping_classes(classes, policy))


class Watches:
    """The watches of one node watch process, started and stopped together."""

    def __init__(
        self,
        make_api: Callable[[], client.ApiClient],
        node_selector: str,
        policy: Callable[[], Policy],
        *,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self.nodes = informer.NodeWatcher(make_api, label_selector=node_selector, backoff=backoff)
        self.slices: informer.Watcher[tuple[DeviceFacts, ...]] = informer.Watcher(
            make_api, SLICES, lambda obj: tuple(devices_of(obj)), backoff=backoff
        )
        self.classes: informer.Watcher[tuple[tuple[str, str], ...]] = informer.Watcher(
            make_api, CLASSES, _classes, backoff=backoff
        )
        self.maker = templates.TemplateMaker(make_api, policy, lambda key: key in self.templates)
        self.templates: informer.Watcher[str] = informer.Watcher(
            make_api,
            templates.TEMPLATES,
            informer.key_of,
            on_object=self.maker.forget,
            label_selector=templates.TEMPLATES_SELECTOR,
            backoff=backoff,
        )
        self.pods: informer.Watcher[str] = informer.Watcher(
            make_api,
            templates.PENDING_PODS,
            informer.key_of,
            on_object=self.maker.pod,
            label_selector=templates.PODS_SELECTOR,
            backoff=backoff,
        )
        self._all: tuple[informer.Watcher[Any], ...] = (
            self.nodes, self.slices, self.classes, self.templates, self.pods,
        )  # fmt: skip
        self._mapped: tuple[str, ...] = ()
        self._seen: tuple[int, Policy] | None = None

    def start(self) -> None:
        for watch in self._all:
            watch.start()

    def stop(self, timeout: float = 5.0) -> None:
        for watch in self._all:
            watch.stop(timeout)

    def version(self) -> tuple[int, int, int]:
        """Changes whenever what the snapshot holds does."""
        return self.nodes.version, self.slices.version, self.classes.version

    def ready(self) -> bool:
        """Whether the DRA kinds have been tried: a first snapshot holds them, or why not."""
        return self.slices.status().tried and self.classes.status().tried

    def snapshot(self) -> tuple[NodeStatus, tuple[NodeFacts, ...], DraFacts]:
        _, status, facts = self.nodes.snapshot()
        devices = tuple(device for found in self.slices.snapshot()[2] for device in found)
        return status, facts, DraFacts(devices, self._class_pairs())

    def _class_pairs(self) -> tuple[tuple[str, str], ...]:
        """(name, resource) of each DeviceClass that maps an extended resource."""
        return tuple(c for found in self.classes.snapshot()[2] for c in found)

    def retry(self) -> None:
        """Try the refused template creates again for the pods that still wait for them."""
        self.maker.retry(lambda key: key in self.pods)

    def counts(self) -> dict[str, int]:
        return {"created": self.maker.created, "failures": self.maker.failures}

    def said_mapped(self, policy: Policy) -> None:
        """Log the DeviceClasses that map the policy's resources, when they change (KEP-5004)."""
        seen = (self.classes.version, policy)
        if seen == self._seen:
            return  # looked at every interval: nothing to do until either changes
        self._seen = seen
        mapped = mapped_classes(self._class_pairs(), policy)
        if mapped == self._mapped:
            return
        self._mapped = mapped
        if mapped:
            log.warning(
                "DeviceClass %s maps the policy's resources (spec.extendedResourceName): "
                "kube-scheduler gives a pod that asks them whole GPUs through DRA, not a "
                "share of one, on nodes whose device plugin does not report them; remove "
                "extendedResourceName from the class",
                ", ".join(mapped),
            )
        else:
            log.info("no DeviceClass maps the policy's resources any more")


def _classes(obj: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    found = class_of(obj)
    return () if found is None else (found,)
