"""A GPU container's accounting region, written before the container starts.

HAMi-core's shim (``try_create_shrreg`` in
``src/multiprocess/multiprocess_memory_limit.c``) takes a region's limits
from the environment of the first process that opens it, under ``lockf``
on the file, and every process that joins an initialised region keeps
them. Written here first, with the limits the webhook pins in the
container's env, the region holds them for a process whose environment
was cleared too (docs/security.md, "A cleared environment").

``fields`` is pure: the container's limits and the layout table in, the
bytes at each offset out, as the shim's own initialisation leaves them
(everything else zero, as in the sparse file it creates). ``initialise``
is the thin edge: open, lock, read the head, write, unlock.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Any, Literal

from webhook.errors import RegionError
from webhook.node.regions import load_table

# The region versions this writer knows the initialised state of. A table made
# from another HAMi-core (tools/region_layout.sh) must be read again before it
# is added: its initialisation may set other fields.
KNOWN_VERSIONS = frozenset({(1, 2)})
# glibc's sem_init(sem, pshared=1, value=1) on a 64-bit machine: the value in the
# first word, then the futex's shared flag (LLL_SHARED, 128); the shim's lock is
# a sem_timedwait on it, so a region without it would wait forever.
SEM_SIZE = 32
SEM_OPEN = struct.pack("<QI", 1, 128)
UTILIZATION_SWITCH = 1  # as the shim sets them on a fresh region
RECENT_KERNEL = 2
PRIORITY = 1  # CUDA_TASK_PRIORITY, which no code of this version reads back
NO_SM_LIMIT = 100  # the shim's value where no compute share is set
DEVICES = 16  # CUDA_DEVICE_MAX_COUNT: the shim fills every device's limit

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MEMORY = re.compile(r"[1-9][0-9]{0,9}m")
_SM = re.compile(r"sm=([1-9][0-9]?|100)")

Outcome = Literal["written", "kept"]


@dataclass(frozen=True)
class Limits:
    """One container's limits, as the webhook pins them in its env."""

    container: str  # its name, and so its region's file name
    memory_mib: int  # every device's memory limit
    sm: int = NO_SM_LIMIT  # every device's compute share, a percentage

    @property
    def file_name(self) -> str:
        return f"{self.container}.cache"

    @property
    def argument(self) -> str:
        """The command-line form ``parse_limits`` reads: ``main=4096m`` or ``main=4096m,sm=30``."""
        share = "" if self.sm == NO_SM_LIMIT else f",sm={self.sm}"
        return f"{self.container}={self.memory_mib}m{share}"


def parse_limits(text: str) -> Limits:
    """``NAME=MEMORYm[,sm=PERCENT]``, as the init step's arguments give each container."""
    name, _, rest = text.partition("=")
    memory, _, share = rest.partition(",")
    if not (len(name) <= 63 and _NAME.fullmatch(name)):
        raise RegionError(
            f"{text!r}: the container name {name!r} is not a container name; "
            "write NAME=MEMORYm[,sm=PERCENT], such as main=4096m"
        )
    if not _MEMORY.fullmatch(memory):
        raise RegionError(
            f"{text!r}: the memory {memory!r} is not a whole number of MiB; "
            "write it as the webhook pins it, such as 4096m"
        )
    found = _SM.fullmatch(share) if share else None
    if share and found is None:
        raise RegionError(
            f"{text!r}: {share!r} is not a compute share; write sm=PERCENT, from 1 to 100"
        )
    return Limits(name, int(memory[:-1]), int(found.group(1)) if found else NO_SM_LIMIT)


@dataclass(frozen=True)
class Table:
    """The offsets ``fields`` writes at, from layout.json."""

    magic: int
    version: tuple[int, int]
    size: int
    at: dict[str, int]  # field name to offset, in shared_region_t
    sizes: dict[str, int]

    @classmethod
    def of(cls, table: dict[str, Any]) -> Table:
        region = table["region"]
        return cls(
            magic=table["magic"],
            version=(table["major_version"], table["minor_version"]),
            size=table["region_size"],
            at={name: field["offset"] for name, field in region.items()},
            sizes={name: field["size"] for name, field in region.items()},
        )


TABLE = Table.of(load_table())
_I32, _U32, _U64, _I64 = (struct.Struct(f) for f in ("<i", "<I", "<Q", "<q"))


def check_known(table: Table) -> None:
    """Refuse a layout whose fresh state this writer does not know."""
    if table.version not in KNOWN_VERSIONS or table.sizes["sem"] != SEM_SIZE:
        major, minor = table.version
        raise RegionError(
            f"the region layout is version {major}.{minor} (sem {table.sizes['sem']} bytes); "
            "this writer knows version 1.2 only: use the image built with this layout"
        )


def fields(limits: Limits, now: int, table: Table = TABLE) -> list[tuple[int, bytes]]:
    """What a fresh region holds, as (offset, bytes), the initialised flag last.

    ``now`` is the time the shim stamps as the last kernel launch when it
    opens a region (seconds since the epoch).
    """
    check_known(table)
    at = table.at
    memory = _U64.pack(limits.memory_mib << 20) * DEVICES
    return [
        (at["major_version"], _U32.pack(table.version[0])),
        (at["minor_version"], _U32.pack(table.version[1])),
        (at["sem"], SEM_OPEN),
        (at["limit"], memory),
        (at["sm_limit"], _U64.pack(limits.sm) * DEVICES),
        (at["utilization_switch"], _I32.pack(UTILIZATION_SWITCH)),
        (at["recent_kernel"], _I32.pack(RECENT_KERNEL)),
        (at["priority"], _I32.pack(PRIORITY)),
        (at["last_kernel_time"], _I64.pack(now)),
        (at["sem_postinit"], SEM_OPEN),
        (table.size, b"\0"),  # the byte past the struct the shim writes to size its file
        (at["initialized_flag"], _I32.pack(table.magic)),
    ]


def state(head: bytes, table: Table = TABLE) -> Literal["fresh", "initialised"]:
    """Whether the region must be written; a region of another version is refused."""
    if len(head) < 12 or _I32.unpack_from(head, 0)[0] != table.magic:
        return "fresh"  # the shim, too, initialises any file without the flag
    version = (_U32.unpack_from(head, 4)[0], _U32.unpack_from(head, 8)[0])
    if version != table.version:
        raise RegionError(
            f"the region is initialised with version {version[0]}.{version[1]}; this writer "
            f"knows {table.version[0]}.{table.version[1]}: the node's shim and this image differ"
        )
    return "initialised"


def initialise(folder: str, limits: Limits, now: int, table: Table = TABLE) -> Outcome:
    """Write ``limits``' region in ``folder`` unless one is there: the first writer wins.

    Opened as the shim opens it (created mode 0666, so a container of any
    user can map it), and locked with ``lockf`` over the struct as the
    shim locks it, so a process that opens it meanwhile waits.
    """
    writes = fields(limits, now, table)  # refused before any file is touched
    path = os.path.join(folder, limits.file_name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as error:
        raise RegionError(f"{path}: cannot open the region: {error.strerror}") from None
    try:
        os.fchmod(fd, 0o666)  # the umask took some; the shim clears it before creating
        os.lockf(fd, os.F_LOCK, table.size)  # from offset 0, which a new open is at
        try:
            if state(os.pread(fd, 12, 0), table) == "initialised":
                return "kept"
            for offset, data in writes:
                os.pwrite(fd, data, offset)
            return "written"
        finally:
            os.lseek(fd, 0, os.SEEK_SET)
            os.lockf(fd, os.F_ULOCK, table.size)
    except OSError as error:
        raise RegionError(f"{path}: cannot write the region: {error.strerror}") from None
    finally:
        os.close(fd)
