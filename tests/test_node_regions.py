"""The node agent's reader: regions written from the committed layout, good and bad."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.regionwriter import REGION, SLOT, TABLE, Proc, Spec, plant, region
from webhook.node import regions
from webhook.node.regions import Device, Skip, Skipped, parse, parse_bytes
from webhook.node.usage import Pod, admitted, index, scan

GIB = 2**30
MIB = 2**20


def test_the_table_names_the_commit_it_came_from() -> None:
    assert len(TABLE["hami_core_commit"]) == 40
    assert regions.LAYOUT.commit == TABLE["hami_core_commit"]
    assert regions.LAYOUT.size == TABLE["region_size"]


def test_a_region_reads_as_written() -> None:
    spec = Spec(
        limits=[4 * GIB, 8 * GIB],
        sm_limits=[30, 0],
        uuids=["GPU-aaaa", "GPU-bbbb"],
        procs=[
            Proc(pid=7, used=[1 * GIB, 0], util=[20, 0]),
            Proc(pid=0, used=[9 * GIB, 9 * GIB], util=[90, 90]),  # a slot being freed: not counted
            Proc(pid=9, used=[512 * MIB, 3 * GIB], util=[5, 40]),
        ],
    )
    found = parse_bytes(region(spec))
    assert found.processes == 3
    assert found.devices == (
        Device(0, "GPU-aaaa", 1 * GIB + 512 * MIB, 4 * GIB, 30, 25),
        Device(1, "GPU-bbbb", 3 * GIB, 8 * GIB, 0, 40),
    )


def test_a_region_with_no_process_yet_uses_nothing() -> None:
    found = parse_bytes(region(Spec()))
    assert (found.processes, found.devices[0].used_bytes) == (0, 0)


BAD = {
    "empty": (b"", Skip.TRUNCATED),
    "truncated": (region(Spec())[: TABLE["region_size"] - 1], Skip.TRUNCATED),
    "wrong-magic": (region(Spec(magic=1234)), Skip.MAGIC),
    "not-initialised": (region(Spec(magic=0)), Skip.MAGIC),
    "older-version": (region(Spec(minor=1)), Skip.VERSION),
    "newer-major": (region(Spec(major=2)), Skip.VERSION),
    "too-many-devices": (region(Spec(device_num=TABLE["device_max"] + 1)), Skip.GARBAGE),
    "too-many-processes": (region(Spec(proc_num=TABLE["process_max"] + 1)), Skip.GARBAGE),
    "negative-processes": (region(Spec(proc_num=-1)), Skip.GARBAGE),
    "torn-write": (region(Spec(procs=[Proc(seqlock=3, used=[GIB])])), Skip.TORN),
    "garbage": (os.urandom(TABLE["region_size"]), Skip.MAGIC),
}


@pytest.mark.parametrize(("data", "reason"), BAD.values(), ids=BAD.keys())
def test_a_bad_region_is_skipped_with_its_reason(data: bytes, reason: Skip) -> None:
    with pytest.raises(Skipped) as caught:
        parse_bytes(data)
    assert caught.value.reason is reason


def _live(data: bytes, writes: list[int]) -> Callable[[int, int], bytes]:
    """Reads of a region whose writer moves the first slot's seqlock once per read of it."""
    buf = bytearray(data)
    seq_at = REGION["procs"]["offset"] + SLOT["seqlock"]["offset"]

    def fetch(offset: int, size: int) -> bytes:
        if offset == seq_at and writes:
            buf[seq_at : seq_at + 8] = writes.pop(0).to_bytes(8, "little")
        return bytes(buf[offset : offset + size])

    return fetch


SEQUENCES = {
    "writer-inside-then-done": ([3, 4, 4], 2 * GIB),  # odd: read again; 4 and 4: consistent
    "moved-during-the-read": ([4, 6, 6, 6], 2 * GIB),  # 4 then 6: read again
}


@pytest.mark.parametrize(("writes", "used"), SEQUENCES.values(), ids=SEQUENCES.keys())
def test_the_seqlock_is_read_again_until_consistent(writes: list[int], used: int) -> None:
    data = region(Spec(procs=[Proc(used=[used])]))
    assert parse(_live(data, writes)).devices[0].used_bytes == used


def test_a_writer_inside_through_every_retry_is_torn() -> None:
    data = region(Spec(procs=[Proc(used=[GIB])]))
    with pytest.raises(Skipped) as caught:
        parse(_live(data, [1, 3, 5, 7, 9, 11, 13, 15, 17]))
    assert caught.value.reason is Skip.TORN


STATUS = '{"containers":{"main":{"memory":"4096m"},"side":{"memory":"bad"}},"demand":"4GiB"}'
ANNOTATIONS = {
    "ours": (STATUS, {"main": 4096 * MIB}),
    "absent": (None, {}),
    "not-json": ("{", {}),
    "not-an-object": ('"x"', {}),
    "no-containers": ("{}", {}),
}


@pytest.mark.parametrize(("raw", "limits"), ANNOTATIONS.values(), ids=ANNOTATIONS.keys())
def test_the_admitted_limits_come_from_the_status_annotation(
    raw: object, limits: dict[str, int]
) -> None:
    assert admitted(raw) == limits


def _pod(uid: str, name: str, status: str | None = STATUS) -> dict[str, object]:
    annotations = {"gpushare-webhook.io/status": status} if status else {}
    return {"metadata": {"uid": uid, "namespace": "ml", "name": name, "annotations": annotations}}


def test_a_scan_names_each_region_by_its_pod_and_counts_the_bad_ones(tmp_path: Path) -> None:
    pods = index([_pod("u1", "train"), _pod("u2", "other"), {"metadata": {}}])
    used = Proc(used=[GIB], util=[10])
    plant(tmp_path, "u1", "main", region(Spec(procs=[used])))
    plant(tmp_path, "u2", "main", region(Spec(limits=[16 * GIB], procs=[used])))  # tampered
    plant(tmp_path, "u2", "side", region(Spec(magic=0)))
    plant(tmp_path, "u3", "main", region(Spec()))  # a pod the API does not list
    gone = plant(tmp_path, "u1", "gone", b"")
    gone.unlink()
    gone.symlink_to(tmp_path / "removed-after-listing")  # listed, then not there to open
    (gone.parent / "notes.txt").write_text("not a region")
    (tmp_path / "u4").mkdir()  # a pod without the volume
    (tmp_path / "stray-file").write_text("")

    found = scan(tmp_path, pods)

    assert [(s.pod.name, s.container, s.device.used_bytes, s.tampered) for s in found.samples] == [
        ("train", "main", GIB, False),
        ("other", "main", GIB, True),
    ]
    assert dict(found.skipped) == {Skip.MAGIC: 1, Skip.UNREADABLE: 1}
    assert found.unknown == 1


def test_a_container_the_webhook_recorded_no_limit_for_is_never_tampered(tmp_path: Path) -> None:
    plant(tmp_path, "u1", "extra", region(Spec(limits=[0], procs=[Proc()])))
    (sample,) = scan(tmp_path, {"u1": Pod("u1", "ml", "train", {})}).samples
    assert (sample.admitted_bytes, sample.tampered) == (None, False)


def test_an_empty_or_missing_pods_directory_has_nothing(tmp_path: Path) -> None:
    assert scan(tmp_path, {}).samples == []
    assert scan(tmp_path / "absent", {}).samples == []


HAMI_CORE = os.environ.get("GPUSHARE_HAMI_CORE_SOURCE", "")
FILL = textwrap.dedent(
    """
    #include <stdio.h>
    #include <string.h>
    #include "multiprocess/multiprocess_memory_limit.h"
    static shared_region_t r;
    int main(int argc, char **argv) {
        r.initialized_flag = MULTIPROCESS_SHARED_REGION_MAGIC_FLAG;
        r.major_version = MAJOR_VERSION;
        r.minor_version = MINOR_VERSION;
        r.device_num = 2;
        strcpy(r.uuids[1], "GPU-from-the-header");
        r.limit[0] = 1ULL << 32; r.limit[1] = 3ULL << 30;
        r.sm_limit[1] = 50;
        r.proc_num = 2;
        r.procs[0].pid = 11; r.procs[1].pid = 12;
        r.procs[0].used[1].total = 1ULL << 30; r.procs[1].used[1].total = 1ULL << 29;
        r.procs[0].device_util[1].sm_util = 17; r.procs[1].seqlock = 8;
        FILE *f = fopen(argv[1], "wb");
        fwrite(&r, sizeof r, 1, f);
        return fclose(f) != 0;
    }
    """
)


@pytest.mark.skipif(not HAMI_CORE, reason="GPUSHARE_HAMI_CORE_SOURCE names no HAMi-core checkout")
def test_a_region_filled_through_hami_cores_own_header_reads_back(tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "GPUSHARE_HAMI_CORE_SOURCE is set but there is no C compiler"
    stubs = Path(__file__).parent.parent / "tools" / "region_stubs"
    (tmp_path / "fill.c").write_text(FILL)
    binary, out = tmp_path / "fill", tmp_path / "region.cache"
    subprocess.run(
        [
            compiler,
            "-std=gnu11",
            f"-I{stubs}",
            f"-I{HAMI_CORE}/src",
            "-o",
            binary,
            tmp_path / "fill.c",
        ],
        check=True,
    )
    subprocess.run([binary, out], check=True)
    found = regions.read(out)
    assert found.processes == 2
    assert found.devices == (
        Device(0, "", 0, 4 * GIB, 0, 0),
        Device(1, "GPU-from-the-header", GIB + GIB // 2, 3 * GIB, 50, 17),
    )
