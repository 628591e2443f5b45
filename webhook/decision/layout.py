"""What the webhook puts in every GPU container, worked out once per policy.

Owns the names the webhook reserves (the shim's volume, the status
annotation, LD_PRELOAD) and the layout the shim section of a policy gives:
the hostPath volume, the read-only mounts (and their paths, to compare a
container's own mounts with), and the names of the limit variables.
Checks and injection both read it; it is data, shared by every patch
of the policy (``Fixed`` values, never changed).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import NamedTuple

from webhook.decision.patch import Fixed
from webhook.decision.policy import LD_SO_PRELOAD, EnvNames, Shim

VOLUME_NAME = "gpushare-shim"
STATUS_ANNOTATION = "gpushare-webhook.io/status"
PRELOAD = "LD_PRELOAD"


class Mount(NamedTuple):
    """One read-only mount of the shim's volume."""

    path: str  # its mount path with one trailing slash, to compare with a container's mounts
    entry: Fixed  # the volumeMounts entry


@dataclass(frozen=True)
class Layout:
    preload: str  # the shim's path in the container, first in LD_PRELOAD
    volume: Fixed  # the shim's hostPath volume
    mount_dir: str  # the shim's mount path with one trailing slash, to compare paths
    mounts: tuple[Mount, ...]
    mount_paths: frozenset[str]
    memory_limit: str
    sm_limit: str
    shadow: re.Pattern[str]  # per-device variants of the limits (CUDA_DEVICE_MEMORY_LIMIT_3)
    mib_per_unit: int


# NB: a memo keyed by the (frozen, hashable) parts of a policy that shape the
# layout: a policy reload with the same shim and names reuses it.
@functools.lru_cache(maxsize=16)
def layout(shim: Shim, env: EnvNames, mib_per_unit: int) -> Layout:
    mount_dir = shim.mount_path.rstrip("/") + "/"
    mounts = [
        Mount(
            mount_dir, Fixed({"name": VOLUME_NAME, "mountPath": shim.mount_path, "readOnly": True})
        )
    ]
    if shim.ld_so_preload:
        # NB: <hostPath>/ld.so.preload lists the library by its path in the container.
        preload_list = {
            "name": VOLUME_NAME,
            "mountPath": LD_SO_PRELOAD,
            "subPath": "ld.so.preload",
            "readOnly": True,
        }
        mounts.append(Mount(LD_SO_PRELOAD + "/", Fixed(preload_list)))
    names = f"{re.escape(env.memory_limit)}|{re.escape(env.sm_limit)}"
    return Layout(
        preload=shim.preload,
        volume=Fixed(
            {"name": VOLUME_NAME, "hostPath": {"path": shim.host_path, "type": "Directory"}}
        ),
        mount_dir=mount_dir,
        mounts=tuple(mounts),
        mount_paths=frozenset(m.path for m in mounts),
        memory_limit=env.memory_limit,
        sm_limit=env.sm_limit,
        shadow=re.compile(rf"({names})_\d+"),
        mib_per_unit=mib_per_unit,
    )
