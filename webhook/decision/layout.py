"""What the webhook puts in every GPU container, as the shim section of a policy gives it.

Owns the names of the volumes the webhook reserves (the accounting
volume's is ``webhook.decision.contract``'s) and the layout of a policy:
the volumes, the mounts (and their paths, to compare a container's own
mounts with), the names of the limit variables, and the variables pinned
for one ask. Checks and
injection both read it; it is data, made once per policy
(``webhook.decision.prepared``) and shared by every patch of the policy,
so no one may change it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhook.decision import contract
from webhook.decision.contract import ACCOUNTING_VOLUME
from webhook.decision.policy import LD_SO_PRELOAD, Policy, folder
from webhook.decision.quantities import limit_text

VOLUME_NAME = "gpushare-shim"
# An empty file over the shim's override file (see webhook.decision.contract).
NO_OVERRIDE_VOLUME = "gpushare-shim-no-override"
# The pod's own emptyDir for the shim's accounting regions (contract.ACCOUNTING_VOLUME
# at contract.REGION_DIR): writable whatever the container's user or root
# filesystem, since the kubelet makes an emptyDir's folder mode 0777
# (pkg/volume/emptydir/empty_dir.go, setupDir), and readable by the node.
# Room for 16 whole regions (contract.REGION_BYTES each): past its sizeLimit
# the kubelet evicts the pod, and sparse regions never come near it.
ACCOUNTING_SIZE = "32Mi"
PRELOAD = "LD_PRELOAD"
# The init step that writes each GPU container's region (shim.initRegions), first
# of the pod's init containers so it runs before any GPU container, init ones too.
INIT_STEP = "gpushare-regions"


class Pinned(NamedTuple):
    """The variables pinned in one container: by name, and as env entries in order."""

    values: dict[str, str]
    entries: tuple[dict[str, str], ...]  # ``values`` as env entries, to append
    env: list[dict[str, str]]  # a whole env (``entries`` and LD_PRELOAD), for a container with none


class Mount(NamedTuple):
    """One mount of one of the webhook's volumes."""

    path: str  # its mount path with one trailing slash, to compare with a container's mounts
    entry: dict[str, Any]  # the volumeMounts entry
    holds: str  # what is mounted there, for a message about a mount that would hide it


@dataclass(frozen=True)
class Layout:
    preload: str  # the shim's path in the container, first in LD_PRELOAD
    volumes: tuple[dict[str, Any], ...]  # ours, the shim's hostPath first
    all_volumes: list[dict[str, Any]]  # ``volumes`` as one list, for a pod with none
    volume_names: frozenset[str]
    mount_dir: str  # the shim's mount path with one trailing slash, to compare paths
    region_dir: str  # the accounting volume's mount path, likewise
    mounts: tuple[Mount, ...]
    all_mounts: list[dict[str, Any]]  # the mounts' entries as one list, for a container with none
    placed: frozenset[tuple[str, str]]  # (volume, path) of each of our mounts
    holds: Mapping[str, str]  # what is mounted at each of our paths, for messages
    memory_limit: str
    sm_limit: str
    shadow: re.Pattern[str]  # per-device variants of the limits (CUDA_DEVICE_MEMORY_LIMIT_3)
    mib_per_unit: int
    init_image: str  # the init step's image; empty: no init step, no fallback mount

    def fallback(self, container: str) -> Mount:
        """The container's own region at the path the shim opens without its variable."""
        entry = {
            "name": ACCOUNTING_VOLUME,
            "mountPath": contract.REGION_FALLBACK,
            "subPath": f"{container}.cache",
        }
        path = folder(contract.REGION_FALLBACK)
        return Mount(path, entry, self.holds[path])

    def pin(self, name: str, memory: int, gpus: int, compute: int | None) -> Pinned:
        """The variables pinned in a container (see webhook.decision.contract).

        The shim reads each device's own variable before the plain one, so
        both are set for every GPU the container gets: a ConfigMap given
        through ``envFrom`` cannot set either, since an ``env`` entry wins.
        """
        mib = limit_text(memory * self.mib_per_unit)
        values = {self.memory_limit: mib}
        for device in range(gpus):
            values[f"{self.memory_limit}_{device}"] = mib
        if compute is not None:
            share = str(compute)
            values[self.sm_limit] = share
            for device in range(gpus):
                values[f"{self.sm_limit}_{device}"] = share
            values[contract.UTILIZATION_POLICY] = contract.UTILIZATION_DEFAULT
        values[contract.REGION] = contract.region_path(name)
        values[contract.REDIRECT] = self.preload
        entries = [{"name": key, "value": value} for key, value in values.items()]
        whole = [*entries, {"name": PRELOAD, "value": self.preload}]
        return Pinned(values, tuple(entries), whole)


def _mount(volume: str, path: str, holds: str, sub_path: str = "") -> Mount:
    entry = {"name": volume, "mountPath": path, "readOnly": True}
    if sub_path:
        entry = {"name": volume, "mountPath": path, "subPath": sub_path, "readOnly": True}
    return Mount(folder(path), entry, holds)


# The shim maps its region read-write (contract.py), so this one mount is not read-only.
_ACCOUNTING = Mount(
    folder(contract.REGION_DIR),
    {"name": ACCOUNTING_VOLUME, "mountPath": contract.REGION_DIR},
    "the GPU shim's accounting",
)


_OWN_REGION = "the container's own accounting region"


def layout_of(policy: Policy) -> Layout:
    """The layout of ``policy``: made once, when the policy is prepared."""
    shim, env = policy.shim, policy.env
    volumes = [{"name": VOLUME_NAME, "hostPath": {"path": shim.host_path, "type": "Directory"}}]
    mounts = [_mount(VOLUME_NAME, shim.mount_path, "the GPU shim")]
    if shim.ld_so_preload:
        # <hostPath>/ld.so.preload lists the library by its path in the container.
        mounts.append(
            _mount(VOLUME_NAME, LD_SO_PRELOAD, "the list of preloaded libraries", "ld.so.preload")
        )
    if shim.override_file:
        volumes.append(
            {"name": NO_OVERRIDE_VOLUME, "hostPath": {"path": "/dev/null", "type": "CharDevice"}}
        )
        mounts.append(
            _mount(
                NO_OVERRIDE_VOLUME, shim.override_file, "an empty file over the shim's overrides"
            )
        )
    volumes.append({"name": ACCOUNTING_VOLUME, "emptyDir": {"sizeLimit": ACCOUNTING_SIZE}})
    mounts.append(_ACCOUNTING)
    names = f"{re.escape(env.memory_limit)}|{re.escape(env.sm_limit)}"
    placed = {(str(m.entry["name"]), m.path) for m in mounts}
    holds = {m.path: m.holds for m in mounts}
    if shim.init_regions:
        placed.add((ACCOUNTING_VOLUME, folder(contract.REGION_FALLBACK)))
        holds[folder(contract.REGION_FALLBACK)] = _OWN_REGION
    return Layout(
        preload=shim.preload,
        volumes=tuple(volumes),
        all_volumes=volumes,
        volume_names=frozenset(str(volume["name"]) for volume in volumes),
        mount_dir=mounts[0].path,
        region_dir=_ACCOUNTING.path,
        mounts=tuple(mounts),
        all_mounts=[mount.entry for mount in mounts],
        placed=frozenset(placed),
        holds=holds,
        memory_limit=env.memory_limit,
        sm_limit=env.sm_limit,
        shadow=re.compile(rf"({names})_\d+"),
        mib_per_unit=policy.mib_per_unit,
        init_image=shim.init_image if shim.init_regions else "",
    )
