"""The shim's side of the contract: everything HAMi-core's ``libvgpu.so`` reads, and our answer.

Read from HAMi-core's source (github.com/Project-HAMi/HAMi-core, commit
8f3a89c of 2026-06-30: ``src/multiprocess/multiprocess_memory_limit.c``,
``src/libvgpu.c``, ``src/nvml/hook.c``, ``src/utils.c``,
``src/log_utils.c``), every ``getenv`` and the one file it reads
variables from. A limit is only as strong as what the shim sees, and a
container's environment has sources the webhook never sees (``envFrom``
ConfigMaps and Secrets, with or without a prefix). Kubernetes gives an
``env`` entry precedence over ``envFrom`` for the same name, so every
variable that could loosen a limit is *pinned*: the webhook writes its
value in the container's ``env`` itself, whatever else is set.

``VARIABLES`` is the list the threat model in docs/security.md shows (a
test holds the two equal); the names the injection uses are below it.
"""

from __future__ import annotations

from typing import NamedTuple


class Variable(NamedTuple):
    name: str
    shim: str  # what HAMi-core does with it
    webhook: str  # what the webhook does about it


VARIABLES = (
    Variable(
        "CUDA_DEVICE_MEMORY_LIMIT_<i>",
        "memory limit of device i (0-15), read *before* the plain variable",
        "pinned to the container's per-GPU limit for each GPU it gets; other indices are "
        "removed from env (devices it cannot see)",
    ),
    Variable(
        "CUDA_DEVICE_MEMORY_LIMIT",
        "memory limit of every device without its own; unset or 0 means no limit",
        "pinned to what the container asked for",
    ),
    Variable(
        "CUDA_DEVICE_SM_LIMIT_<i>",
        "compute (SM) share of device i, read before the plain variable",
        "pinned with a compute share, for each GPU the container gets; other indices removed",
    ),
    Variable(
        "CUDA_DEVICE_SM_LIMIT",
        "compute share of every device without its own; unset, 0 or 100 means none",
        "pinned when a compute share applies; otherwise left, since it can only lower the "
        "container's own share",
    ),
    Variable(
        "GPU_CORE_UTILIZATION_POLICY",
        "`force` always enforces the compute share, `disable` never does",
        "pinned to `default` when a compute share applies",
    ),
    Variable(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "path of the accounting region (default /tmp/cudevshr.cache), created mode 0666; the "
        "limits of the process that creates it hold for every process that opens it later",
        "pinned to /var/run/gpushare/<container>.cache, in the pod's emptyDir "
        "`gpushare-accounting`: no env can point at a prepared file, no two containers share "
        "one region's limits, and the node can read it; with `shim.initRegions` the region is "
        "written before the container starts and also mounted at /tmp/cudevshr.cache",
    ),
    Variable(
        "CUDA_REDIRECT",
        "the library CUDA calls are resolved from; the real libcuda there bypasses every hook",
        "pinned to the shim itself",
    ),
    Variable(
        "/overrideEnv",
        "a file, read when NVML starts, after the region is opened and the limits read: each "
        "KEY=VALUE line is set with setenv, over the pod's env",
        "/dev/null mounted over it, read-only (`shim.overrideFile`)",
    ),
    Variable(
        "CUDA_VISIBLE_DEVICES",
        "maps CUDA device order to NVML's, for accounting",
        "left: every GPU of a container has the same limit, so no order loosens one",
    ),
    Variable(
        "CUDA_TASK_PRIORITY",
        "stored in the accounting region; no code of this version reads it back",
        "left",
    ),
    Variable(
        "ACTIVE_OOM_KILLER",
        "parsed into a flag that no code of this version reads",
        "left",
    ),
    Variable(
        "RECORD_KERNEL_INTERVAL",
        "how often a kernel launch's time is recorded in the region; neither limit reads it",
        "left",
    ),
    Variable("LIBCUDA_LOG_LEVEL", "the shim's log level", "left"),
)

REGION = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
REDIRECT = "CUDA_REDIRECT"
UTILIZATION_POLICY = "GPU_CORE_UTILIZATION_POLICY"
UTILIZATION_DEFAULT = "default"


# A fixed convention, shared with the node agent (webhook.node.usage): the node
# reads each region at
# /var/lib/kubelet/pods/<pod uid>/volumes/kubernetes.io~empty-dir/<volume>/<container>.cache,
# and the kubelet removes it with the pod.
REGION_DIR = "/var/run/gpushare"
REGION_SUFFIX = ".cache"
ACCOUNTING_VOLUME = "gpushare-accounting"  # the pod's emptyDir mounted at REGION_DIR
# The shim maps sizeof(shared_region_t) bytes, 2,008,952 at this commit (x86-64),
# plus one byte it writes past them; a region is a sparse file, so far less is used.
REGION_BYTES = 2_008_953
# Where the shim opens its region when CUDA_DEVICE_MEMORY_SHARED_CACHE is unset
# (try_create_shrreg): with shim.initRegions, each GPU container's own region.
REGION_FALLBACK = "/tmp/cudevshr.cache"


def region_path(container: str) -> str:
    """The accounting region of one container (names are unique within a pod)."""
    return f"{REGION_DIR}/{container}{REGION_SUFFIX}"
