"""HAMi-core's accounting regions: the layout, and reading one region.

Each process that loads ``libvgpu.so`` keeps its GPU memory and SM use in
a file the shim maps shared (``shared_region_t`` in HAMi-core's
``src/multiprocess/multiprocess_memory_limit.h``). ``layout.json`` holds
the offsets of that struct as a C compiler laid it out, with the
HAMi-core commit they came from (``tools/region_layout.sh`` remakes it).

``parse`` is pure: reads at offsets in, a ``Region`` or a ``Skipped`` reason out.
Only ``read`` touches the file, through a ``Fetch`` of the bytes at an
offset, so the seqlock retries see the writer move on.
"""

from __future__ import annotations

import enum
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

TRIES = 4  # seqlock reads per slot before the slot (so the region) counts as torn


class Skip(enum.Enum):
    """Why a region file was not read: the ``reason`` label of the skipped counter."""

    TRUNCATED = "truncated"  # shorter than the struct: being created, or not a region
    MAGIC = "magic"  # not initialised (yet), or not a region at all
    VERSION = "version"  # another HAMi-core layout than the one in layout.json
    GARBAGE = "garbage"  # counts out of range: not a region we can trust
    TORN = "torn"  # a writer held a slot's seqlock through every retry
    UNREADABLE = "unreadable"  # vanished, or could not be opened or mapped


@dataclass(frozen=True)
class Layout:
    """The offsets ``parse`` uses, from layout.json."""

    commit: str
    magic: int
    major: int
    minor: int
    size: int
    device_max: int
    process_max: int
    major_at: int
    minor_at: int
    device_num_at: int
    uuids_at: int
    uuid_size: int
    limit_at: int
    sm_limit_at: int
    procs_at: int
    proc_num_at: int
    slot_size: int
    pid_at: int
    used_at: int
    used_size: int
    total_at: int
    util_at: int
    util_size: int
    sm_util_at: int
    seqlock_at: int

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> Layout:
        region, slot = table["region"], table["slot"]
        return cls(
            commit=table["hami_core_commit"],
            magic=table["magic"],
            major=table["major_version"],
            minor=table["minor_version"],
            size=table["region_size"],
            device_max=table["device_max"],
            process_max=table["process_max"],
            major_at=region["major_version"]["offset"],
            minor_at=region["minor_version"]["offset"],
            device_num_at=region["device_num"]["offset"],
            uuids_at=region["uuids"]["offset"],
            uuid_size=region["uuids"]["size"] // table["device_max"],
            limit_at=region["limit"]["offset"],
            sm_limit_at=region["sm_limit"]["offset"],
            procs_at=region["procs"]["offset"],
            proc_num_at=region["proc_num"]["offset"],
            slot_size=table["slot_size"],
            pid_at=slot["pid"]["offset"],
            used_at=slot["used"]["offset"],
            used_size=table["device_memory_size"],
            total_at=table["device_memory"]["total"]["offset"],
            util_at=slot["device_util"]["offset"],
            util_size=table["device_util_size"],
            sm_util_at=table["device_util"]["sm_util"]["offset"],
            seqlock_at=slot["seqlock"]["offset"],
        )


def load_table() -> dict[str, Any]:
    text = resources.files("webhook.node").joinpath("layout.json").read_text()
    table: dict[str, Any] = json.loads(text)
    return table


LAYOUT = Layout.from_table(load_table())


@dataclass(frozen=True)
class Device:
    """One GPU as a container's region sees it (index as the container numbers them)."""

    index: int
    uuid: str
    used_bytes: int  # summed over the region's processes
    limit_bytes: int  # what the shim holds the container to; 0 is no limit
    sm_limit: int  # percent; 0 is no limit
    sm_util: int  # percent, summed over processes, as the shim last sampled it


@dataclass(frozen=True)
class Region:
    processes: int
    devices: tuple[Device, ...]


class Skipped(Exception):
    def __init__(self, reason: Skip) -> None:
        super().__init__(reason.value)
        self.reason = reason


_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")

# Reads ``size`` bytes at ``offset``: fewer means the file ended there.
Fetch = Callable[[int, int], bytes]


def _field(fetch: Fetch, offset: int, shape: struct.Struct) -> int:
    raw = fetch(offset, shape.size)
    if len(raw) < shape.size:  # cut short while we read it
        raise Skipped(Skip.TRUNCATED)
    value: int = shape.unpack(raw)[0]
    return value


def _slot_read(fetch: Fetch, at: int, devices: int, lay: Layout) -> tuple[list[int], list[int]]:
    """One slot's used totals and SM use per device, consistent under its seqlock.

    The shim's writers make the sequence odd, update, make it even again
    (``add_gpu_device_memory_usage``); a reader outside can only do what its
    own readers do: read the sequence, the data, the sequence again, and
    retry while it was odd or moved.
    """
    span = lay.util_at + devices * lay.util_size  # from the slot to its last device's use
    for _ in range(TRIES):
        before = _field(fetch, at + lay.seqlock_at, _U64)
        if before & 1:
            continue
        raw = fetch(at, span)
        if _field(fetch, at + lay.seqlock_at, _U64) != before:
            continue
        if len(raw) < span:
            raise Skipped(Skip.TRUNCATED)
        used = [
            _U64.unpack_from(raw, lay.used_at + d * lay.used_size + lay.total_at)[0]
            for d in range(devices)
        ]
        util = [
            _U64.unpack_from(raw, lay.util_at + d * lay.util_size + lay.sm_util_at)[0]
            for d in range(devices)
        ]
        return used, util
    raise Skipped(Skip.TORN)


def parse(fetch: Fetch, lay: Layout = LAYOUT) -> Region:
    """A region read through ``fetch``; ``Skipped`` if it cannot be trusted."""
    head = fetch(0, lay.procs_at)
    if len(head) < lay.procs_at:
        raise Skipped(Skip.TRUNCATED)
    if _I32.unpack_from(head, 0)[0] != lay.magic:
        raise Skipped(Skip.MAGIC)
    major, minor = _U32.unpack_from(head, lay.major_at)[0], _U32.unpack_from(head, lay.minor_at)[0]
    if (major, minor) != (lay.major, lay.minor):
        raise Skipped(Skip.VERSION)
    (devices,) = _U64.unpack_from(head, lay.device_num_at)
    procs = _field(fetch, lay.proc_num_at, _I32)
    if devices > lay.device_max or not 0 <= procs <= lay.process_max:
        raise Skipped(Skip.GARBAGE)
    used = [0] * devices
    util = [0] * devices
    for i in range(procs):
        at = lay.procs_at + i * lay.slot_size
        if _field(fetch, at + lay.pid_at, _I32) == 0:  # a slot being handed out or freed
            continue
        slot_used, slot_util = _slot_read(fetch, at, devices, lay)
        used = [a + b for a, b in zip(used, slot_used, strict=True)]
        util = [a + b for a, b in zip(util, slot_util, strict=True)]
    return Region(
        processes=procs,
        devices=tuple(
            Device(
                index=d,
                uuid=_uuid(head, lay.uuids_at + d * lay.uuid_size, lay.uuid_size),
                used_bytes=used[d],
                limit_bytes=_U64.unpack_from(head, lay.limit_at + d * 8)[0],
                sm_limit=_U64.unpack_from(head, lay.sm_limit_at + d * 8)[0],
                sm_util=util[d],
            )
            for d in range(devices)
        ),
    )


def parse_bytes(data: bytes, lay: Layout = LAYOUT) -> Region:
    """A region from a snapshot: a write it caught half-done stays torn."""
    if len(data) < lay.size:
        raise Skipped(Skip.TRUNCATED)
    return parse(lambda offset, size: data[offset : offset + size], lay)


def _uuid(head: bytes, at: int, size: int) -> str:
    return head[at : at + size].split(b"\0", 1)[0].decode("ascii", "replace")


def read(path: str | os.PathLike[str], lay: Layout = LAYOUT) -> Region:
    """Read one region file in place; ``Skipped`` for any file we cannot use.

    pread, not mmap: a region cut short while mapped would kill the
    agent with SIGBUS, and reading only the header and the slots in use
    is a few KiB of the 2 MiB struct.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:  # gone between the listing and the open, a link, or not ours
        raise Skipped(Skip.UNREADABLE) from error
    try:
        if os.fstat(fd).st_size < lay.size:
            raise Skipped(Skip.TRUNCATED)
        return parse(lambda offset, size: os.pread(fd, size, offset), lay)
    except OSError as error:
        raise Skipped(Skip.UNREADABLE) from error
    finally:
        os.close(fd)
