"""A writer of HAMi-core accounting regions, byte for byte from the committed layout table.

It reads webhook/node/layout.json itself, not the reader's ``Layout``, so a
slip in either side shows up as a test failure. Fields the reader does not
use stay zero, as in a region the shim has just created.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

TABLE = json.loads((Path(__file__).parent.parent / "webhook/node/layout.json").read_text())
REGION, SLOT = TABLE["region"], TABLE["slot"]


@dataclass
class Proc:
    pid: int = 100
    used: list[int] = field(default_factory=lambda: [0])  # bytes per device
    util: list[int] = field(default_factory=lambda: [0])  # SM percent per device
    seqlock: int = 2


@dataclass
class Spec:
    limits: list[int] = field(default_factory=lambda: [4096 * 2**20])  # bytes per device
    sm_limits: list[int] = field(default_factory=lambda: [0])
    uuids: list[str] = field(default_factory=lambda: ["GPU-0000"])
    procs: list[Proc] = field(default_factory=list)
    magic: int = TABLE["magic"]
    major: int = TABLE["major_version"]
    minor: int = TABLE["minor_version"]
    device_num: int | None = None  # default: len(limits)
    proc_num: int | None = None  # default: len(procs)


def _put(buf: bytearray, fmt: str, at: int, value: int) -> None:
    struct.pack_into(fmt, buf, at, value)


def region(spec: Spec) -> bytes:
    buf = bytearray(TABLE["region_size"])
    _put(buf, "<i", REGION["initialized_flag"]["offset"], spec.magic)
    _put(buf, "<I", REGION["major_version"]["offset"], spec.major)
    _put(buf, "<I", REGION["minor_version"]["offset"], spec.minor)
    devices = len(spec.limits) if spec.device_num is None else spec.device_num
    _put(buf, "<Q", REGION["device_num"]["offset"], devices)
    uuid_size = REGION["uuids"]["size"] // TABLE["device_max"]
    for d, (limit, sm, uuid) in enumerate(
        zip(spec.limits, spec.sm_limits, spec.uuids, strict=True)
    ):
        _put(buf, "<Q", REGION["limit"]["offset"] + 8 * d, limit)
        _put(buf, "<Q", REGION["sm_limit"]["offset"] + 8 * d, sm)
        at = REGION["uuids"]["offset"] + uuid_size * d
        buf[at : at + len(uuid)] = uuid.encode()
    procs = len(spec.procs) if spec.proc_num is None else spec.proc_num
    _put(buf, "<i", REGION["proc_num"]["offset"], procs)
    for i, proc in enumerate(spec.procs):
        at = REGION["procs"]["offset"] + i * TABLE["slot_size"]
        _put(buf, "<i", at + SLOT["pid"]["offset"], proc.pid)
        _put(buf, "<Q", at + SLOT["seqlock"]["offset"], proc.seqlock)
        for d, (used, util) in enumerate(zip(proc.used, proc.util, strict=True)):
            memory = at + SLOT["used"]["offset"] + d * TABLE["device_memory_size"]
            _put(buf, "<Q", memory + TABLE["device_memory"]["total"]["offset"], used)
            usage = at + SLOT["device_util"]["offset"] + d * TABLE["device_util_size"]
            _put(buf, "<Q", usage + TABLE["device_util"]["sm_util"]["offset"], util)
    return bytes(buf)


def plant(pods_dir: Path, uid: str, container: str, data: bytes) -> Path:
    volume = pods_dir / uid / "volumes" / "kubernetes.io~empty-dir" / "gpushare-accounting"
    volume.mkdir(parents=True, exist_ok=True)
    path = volume / f"{container}.cache"
    path.write_bytes(data)
    return path
