"""What each GPU container of a node uses, against what the webhook admitted.

Owns the host side of the accounting convention: the webhook gives each
GPU container an ``emptyDir`` named ``gpushare-accounting`` and points the
shim's region at ``/var/run/gpushare/<container>.cache`` in it, so on the
host every region is
``<kubelet>/pods/<pod uid>/volumes/kubernetes.io~empty-dir/gpushare-accounting/<container>.cache``.
The pod uid names the pod through the pods the API lists on this node
(handed in as plain objects); the webhook's status annotation says the
limit it admitted each container with. A region whose limit differs was
changed after admission: tampered.

``admitted`` and ``pod_of`` are pure; ``scan`` lists and reads files.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.decision import (
    ACCOUNTING_VOLUME,
    BYTES_PER_MIB,
    REGION_SUFFIX,
    STATUS_ANNOTATION,
    limit_mib,
)
from webhook.node.regions import Device, Region, Skip, Skipped, read

VOLUME_DIR = Path("volumes") / "kubernetes.io~empty-dir" / ACCOUNTING_VOLUME


@dataclass(frozen=True)
class Pod:
    """A pod as the agent needs it: its name and the limits the webhook admitted."""

    uid: str
    namespace: str
    name: str
    admitted: Mapping[str, int]  # container name -> bytes, from the status annotation


@dataclass(frozen=True)
class Sample:
    """One device of one container's region, with the pod it belongs to."""

    pod: Pod
    container: str
    processes: int
    device: Device
    admitted_bytes: int | None  # None: the webhook recorded no limit for this container

    @property
    def tampered(self) -> bool:
        return self.admitted_bytes is not None and self.device.limit_bytes != self.admitted_bytes


@dataclass
class Scan:
    samples: list[Sample] = field(default_factory=list)
    skipped: Counter[Skip] = field(default_factory=Counter)
    unknown: int = 0  # regions of pod uids the API did not list (yet) on this node


def admitted(annotation: object) -> dict[str, int]:
    """Container name -> admitted bytes, from the status annotation; {} if absent or not ours."""
    if not isinstance(annotation, str):
        return {}
    try:
        status = json.loads(annotation)
    except ValueError:
        return {}
    containers = status.get("containers") if isinstance(status, dict) else None
    found: dict[str, int] = {}
    for name, entry in containers.items() if isinstance(containers, dict) else ():
        mib = limit_mib(entry.get("memory")) if isinstance(entry, dict) else None
        if mib is not None:
            found[str(name)] = mib * BYTES_PER_MIB
    return found


def pod_of(obj: Mapping[str, Any]) -> Pod | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("uid"):
        return None
    annotations = meta.get("annotations")
    status = annotations.get(STATUS_ANNOTATION) if isinstance(annotations, Mapping) else None
    return Pod(
        uid=str(meta["uid"]),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        admitted=admitted(status),
    )


def index(objects: Iterable[Mapping[str, Any]]) -> dict[str, Pod]:
    pods = (pod_of(obj) for obj in objects)
    return {pod.uid: pod for pod in pods if pod is not None}


def _entries(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:  # no such pod (any more), or not a directory
        return []


def scan(pods_dir: Path, pods: Mapping[str, Pod]) -> Scan:
    """Every region under the kubelet's pods directory, read; the bad ones counted by reason."""
    result = Scan()
    for uid in _entries(pods_dir):
        volume = pods_dir / uid / VOLUME_DIR
        for name in _entries(volume):
            if not name.endswith(REGION_SUFFIX):
                continue
            try:
                region = read(volume / name)
            except Skipped as skipped:
                result.skipped[skipped.reason] += 1
                continue
            pod = pods.get(uid)
            if pod is None:
                result.unknown += 1
                continue
            result.samples += samples(pod, name.removesuffix(REGION_SUFFIX), region)
    return result


def samples(pod: Pod, container: str, region: Region) -> list[Sample]:
    limit = pod.admitted.get(container)
    return [Sample(pod, container, region.processes, device, limit) for device in region.devices]
