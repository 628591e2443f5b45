"""The init step's writer: regions as HAMi-core creates them, first writer wins, bad input.

The harness tests at the end run HAMi-core's own region code
(``src/multiprocess/multiprocess_memory_limit.c``, compiled unchanged with
tests/harness/stubs.c for NVML) on a region this writer made, where
GPUSHARE_HAMI_CORE_SOURCE names a checkout. A process that lost its
environment (``env -i``) opens ``/tmp/cudevshr.cache``; the kubelet's
subPath mount of the container's region there is stood in for by a bind
mount in a mount namespace of the test's own (``unshare``), the same
kind of mount.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import GPU, apply, container, pod, unavailable
from tests.regionwriter import REGION, TABLE, Spec, region
from webhook.cli import main
from webhook.decision.plan import plan
from webhook.decision.policy import parse_policy_text
from webhook.decision.prepared import Prepared
from webhook.errors import RegionError
from webhook.node import regioninit, regions
from webhook.node.regioninit import Limits, fields, initialise, parse_limits, state

MIB = 2**20
GIB = 2**30
COMPUTE = "aliyun.com/gpu-core.percentage"
ON = "shim: {initRegions: true}"

GOOD = {
    "memory": ("main=4096m", Limits("main", 4096)),
    "share": ("train-2=512m,sm=30", Limits("train-2", 512, 30)),
    "whole-share": ("a=1m,sm=100", Limits("a", 1, 100)),
}


@pytest.mark.parametrize(("text", "limits"), GOOD.values(), ids=GOOD.keys())
def test_an_argument_reads_as_the_limits_and_back(text: str, limits: Limits) -> None:
    assert parse_limits(text) == limits
    assert parse_limits(limits.argument) == limits


BAD = {
    "no-name": ("=4096m", "is not a container name"),
    "upper-case": ("Main=4096m", "is not a container name"),
    "slash": ("../x=4096m", "is not a container name"),
    "too-long": ("a" * 64 + "=1m", "is not a container name"),
    "no-memory": ("main", "is not a whole number of MiB"),
    "gib": ("main=4g", "is not a whole number of MiB"),
    "zero": ("main=0m", "is not a whole number of MiB"),
    "huge": ("main=12345678901m", "is not a whole number of MiB"),
    "share-zero": ("main=1m,sm=0", "is not a compute share"),
    "share-over": ("main=1m,sm=101", "is not a compute share"),
    "share-word": ("main=1m,30", "is not a compute share"),
}


@pytest.mark.parametrize(("text", "words"), BAD.values(), ids=BAD.keys())
def test_a_bad_argument_is_one_line_naming_it(text: str, words: str) -> None:
    with pytest.raises(RegionError, match=words) as caught:
        parse_limits(text)
    assert repr(text) in str(caught.value)
    assert "\n" not in str(caught.value)


def _made(limits: Limits, now: int = 1_700_000_000) -> bytearray:
    buf = bytearray(TABLE["region_size"] + 1)
    for offset, data in fields(limits, now):
        buf[offset : offset + len(data)] = data
    return buf


def test_a_fresh_region_reads_back_with_the_limits_on_every_device() -> None:
    buf = _made(Limits("main", 4096, 30))
    found = regions.parse_bytes(bytes(buf))
    assert found.processes == 0  # no process yet; the shim counts its devices when one opens it
    at = REGION["limit"]["offset"]
    limits = [int.from_bytes(buf[at + 8 * d : at + 8 * d + 8], "little") for d in range(16)]
    at = REGION["sm_limit"]["offset"]
    shares = [int.from_bytes(buf[at + 8 * d : at + 8 * d + 8], "little") for d in range(16)]
    assert (limits, shares) == ([4 * GIB] * 16, [30] * 16)


def test_the_fields_the_shim_sets_on_a_fresh_region_are_set_and_the_flag_is_last() -> None:
    writes = fields(Limits("main", 1), 1234)
    assert writes[-1] == (0, TABLE["magic"].to_bytes(4, "little"))
    buf = _made(Limits("main", 1), 1234)

    def word(name: str, size: int = 4) -> int:
        at = REGION[name]["offset"]
        return int.from_bytes(buf[at : at + size], "little", signed=True)

    assert (word("major_version"), word("minor_version")) == (1, 2)
    assert (word("utilization_switch"), word("recent_kernel"), word("priority")) == (1, 2, 1)
    assert (word("proc_num"), word("sm_init_flag"), word("last_kernel_time", 8)) == (0, 0, 1234)
    assert len(buf) == TABLE["region_size"] + 1  # the shim's file: the struct and one byte


def test_the_semaphores_are_what_glibc_sem_init_makes_for_a_shared_one() -> None:
    libc = ctypes.CDLL(None)
    sem = ctypes.create_string_buffer(b"\xaa" * regioninit.SEM_SIZE)
    assert libc.sem_init(sem, 1, 1) == 0
    made = sem.raw[: len(regioninit.SEM_OPEN)]
    assert made == regioninit.SEM_OPEN
    buf = _made(Limits("main", 1))
    for name in ("sem", "sem_postinit"):
        at = REGION[name]["offset"]
        assert bytes(buf[at : at + len(made)]) == made


def test_a_layout_of_another_version_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    other = dataclasses.replace(regioninit.TABLE, version=(1, 3))
    with pytest.raises(RegionError, match=r"version 1\.3 .* knows version 1\.2 only"):
        initialise(str(tmp_path), Limits("main", 1), 0, other)
    assert list(tmp_path.iterdir()) == []


STATES: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "fresh"),
    "zeros": (bytes(12), "fresh"),
    "other-magic": (region(Spec(magic=1))[:12], "fresh"),
    "initialised": (region(Spec())[:12], "initialised"),
}


@pytest.mark.parametrize(("head", "found"), STATES.values(), ids=STATES.keys())
def test_the_state_of_a_region_is_read_from_its_flag(head: bytes, found: str) -> None:
    assert state(head) == found


@pytest.mark.parametrize("version", [(1, 1), (2, 2)], ids=["older", "newer"])
def test_an_initialised_region_of_another_version_is_refused(version: tuple[int, int]) -> None:
    head = region(Spec(major=version[0], minor=version[1]))[:12]
    with pytest.raises(RegionError, match=f"initialised with version {version[0]}.{version[1]}"):
        state(head)


def test_the_command_writes_each_region_once_and_the_first_writer_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(tmp_path)
    assert main(["node", "init-regions", "--dir", folder, "main=4096m", "side=1024m,sm=20"]) == 0
    assert main(["node", "init-regions", "--dir", folder, "main=8192m"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"{folder}/main.cache: written (4096 MiB, SM 100% on every device)",
        f"{folder}/side.cache: written (1024 MiB, SM 20% on every device)",
        f"{folder}/main.cache: kept (initialised before: the first writer's limits stand)",
    ]
    main_region = tmp_path / "main.cache"
    assert stat.S_IMODE(main_region.stat().st_mode) == 0o666  # any container user maps it
    assert main_region.stat().st_size == TABLE["region_size"] + 1
    assert regions.read(main_region) == regions.Region(0, ())
    limit_at = REGION["limit"]["offset"]
    assert main_region.read_bytes()[limit_at : limit_at + 8] == (4 * GIB).to_bytes(8, "little")


def test_the_step_the_webhook_adds_runs_this_command_with_the_limits_it_pins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = pod(
        container(gpu="4") | {"resources": {"limits": {GPU: "4", COMPUTE: "30"}}},
        container("side", gpu="2"),
    )
    stored = apply(obj, list(plan(obj, Prepared(parse_policy_text(ON))).patch))
    step = stored["spec"]["initContainers"][0]
    assert step["command"][:3] == ["gpushare-webhook", "node", "init-regions"]
    assert main([*step["command"][1:], "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path}/main.cache: written (4096 MiB, SM 30% on every device)",
        f"{tmp_path}/side.cache: written (2048 MiB, SM 100% on every device)",
    ]
    env = {e["name"]: e["value"] for e in stored["spec"]["containers"][0]["env"]}
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "4096m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"


COMMAND_ERRORS = {
    "bad-argument": (True, ["main=4096m", "side=4g"], "'side=4g': the memory '4g'"),
    "no-folder": (False, ["main=1m"], "main.cache: cannot open the region"),
}


@pytest.mark.parametrize(
    ("exists", "given", "words"), COMMAND_ERRORS.values(), ids=COMMAND_ERRORS.keys()
)
def test_a_command_that_cannot_write_says_why_in_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], exists: bool, given: list[str], words: str
) -> None:
    folder = tmp_path / "accounting"
    if exists:
        folder.mkdir()
    assert main(["node", "init-regions", "--dir", str(folder), *given]) == 2
    err = capsys.readouterr().err
    assert words in err
    assert err.count("\n") == 1
    assert list(folder.iterdir()) == [] if exists else not folder.exists()


def test_a_region_of_another_version_is_left_as_it_is(tmp_path: Path) -> None:
    old = region(Spec(minor=1))
    (tmp_path / "main.cache").write_bytes(old)
    with pytest.raises(RegionError, match=r"initialised with version 1\.1"):
        initialise(str(tmp_path), Limits("main", 4096), 0)
    assert (tmp_path / "main.cache").read_bytes() == old


# HAMi-core's own region code, on a region this writer made.

HAMI_CORE = os.environ.get("GPUSHARE_HAMI_CORE_SOURCE", "")
HARNESS = Path(__file__).parent / "harness"
STUBS = Path(__file__).parent.parent / "tools" / "region_stubs"
needs_hami_core = pytest.mark.skipif(
    not HAMI_CORE, reason="GPUSHARE_HAMI_CORE_SOURCE names no HAMi-core checkout"
)
# Where the region and the harness are bound in the namespace, over a /tmp of its own.
INSIDE = "/mnt"


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The harness, built from HAMi-core's source; a checkout that cannot build it fails in CI."""
    source = Path(HAMI_CORE) / "src" / "multiprocess" / "multiprocess_memory_limit.c"
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not source.is_file() or compiler is None:
        unavailable("the region harness", f"no {source} or no C compiler")
    out = tmp_path_factory.mktemp("harness") / "harness"
    built = subprocess.run(
        [
            compiler,
            "-std=gnu11",
            "-O1",
            f"-I{HARNESS}",
            f"-I{STUBS}",
            f"-I{HAMI_CORE}/src",
            "-o",
            str(out),
            str(HARNESS / "harness.c"),
            str(HARNESS / "stubs.c"),
            str(source),
            "-lpthread",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        unavailable("the region harness", built.stderr.strip().splitlines()[-1:])
    return out


def _read(line: str) -> dict[str, int]:
    return {key: int(value) for key, value in (item.split("=") for item in line.split())}


def _container_env(region_file: Path) -> dict[str, str]:
    """The variables the webhook pins in a container asking 4 GiB and 30% of one GPU."""
    return {
        "CUDA_DEVICE_MEMORY_LIMIT": "4096m",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_SM_LIMIT_0": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(region_file),
        "PATH": "/usr/bin:/bin",
    }


def _cleared(folder: Path, harness: Path, use: int) -> dict[str, int]:
    """The harness with an empty environment, its /tmp/cudevshr.cache the region in ``folder``."""
    shutil.copy(harness, folder / "harness")
    script = (
        "set -e; mount --make-rprivate /; "
        f'mount --bind "$1" {INSIDE}; mount -t tmpfs none /tmp; : > /tmp/cudevshr.cache; '
        f"mount --bind {INSIDE}/main.cache /tmp/cudevshr.cache; "
        f'exec env -i {INSIDE}/harness "$2"'
    )
    ran = subprocess.run(
        [*_unshare(), "sh", "-c", script, "sh", str(folder), str(use)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    return _read(ran.stdout)


def _unshare() -> list[str]:
    """A mount namespace of the test's own: as root, or as root of a user namespace."""
    unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "-rm"]
    probe = subprocess.run(
        [*unshare, "sh", "-c", f"mount -t tmpfs none {INSIDE}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        unavailable("a mount namespace for the env -i process", probe.stderr.strip()[-300:])
    return unshare


def _hold(harness: Path, env: dict[str, str], use: int) -> tuple[subprocess.Popen[str], Any]:
    """The harness kept running with its use, until ``_leave``."""
    held = subprocess.Popen(
        [str(harness), str(use), "hold"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert held.stdout is not None
    return held, _read(held.stdout.readline())


def _leave(held: subprocess.Popen[str]) -> None:
    assert held.stdin is not None
    assert held.stdout is not None
    held.stdin.close()
    held.stdout.close()
    held.wait(timeout=30)


@needs_hami_core
def test_with_its_env_or_none_a_process_is_held_to_the_region_the_writer_made(
    harness: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "accounting"
    folder.mkdir()
    assert initialise(str(folder), parse_limits("main=4096m,sm=30"), 0) == "written"
    mine = folder / "main.cache"
    held, first = _hold(harness, _container_env(mine), 3 * MIB)
    try:
        cleared = _cleared(folder, harness, 5 * MIB)
        again = _cleared(folder, harness, 0)
    finally:
        _leave(held)
    limits = {"limit": 4 * GIB, "limit15": 4 * GIB, "sm": 30, "sm15": 30}
    assert first == {**limits, "used": 3 * MIB}
    assert cleared == {**limits, "used": 8 * MIB}  # one region: both processes' use
    assert again == {**limits, "used": 3 * MIB}  # the env -i one left; its use went with it
    found = regions.read(mine)
    assert found.devices == ()  # the stubbed NVML counts no device; the limits are above


@needs_hami_core
def test_without_the_init_step_an_empty_environment_would_have_set_no_limit(
    harness: Path, tmp_path: Path
) -> None:
    """The hole the init step closes, shown by the same harness: the first opener's env wins."""
    folder = tmp_path / "accounting"
    folder.mkdir()
    (folder / "main.cache").touch()  # the kubelet needs the file to mount it
    cleared = _cleared(folder, harness, 0)
    held, joined = _hold(harness, _container_env(folder / "main.cache"), 0)
    _leave(held)
    assert (cleared["limit"], joined["limit"]) == (0, 0)


@needs_hami_core
def test_a_region_the_writer_made_is_the_one_the_shim_makes_from_the_same_env(
    harness: Path, tmp_path: Path
) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    initialise(str(ours), parse_limits("main=4096m,sm=30"), 0)
    for folder in (ours, theirs):  # a process opens each, and leaves
        env = _container_env(folder / "main.cache")
        subprocess.run([str(harness)], env=env, check=True, capture_output=True, timeout=60)
    a, b = ((folder / "main.cache").read_bytes() for folder in (ours, theirs))
    assert len(a) == len(b) == TABLE["region_size"] + 1
    head = REGION["procs"]["offset"]  # the slots hold the process that came and went
    tail = REGION["proc_num"]["offset"]
    stamp = REGION["last_kernel_time"]["offset"]  # each opener's clock
    assert a[:head] == b[:head]
    assert a[tail:stamp] == b[tail:stamp]
    assert a[stamp + 8 :] == b[stamp + 8 :]


@needs_hami_core
def test_a_region_the_shim_made_is_kept_and_one_of_another_version_refused(
    harness: Path, tmp_path: Path
) -> None:
    mine = tmp_path / "main.cache"
    subprocess.run([str(harness)], env=_container_env(mine), check=True, capture_output=True)
    made = mine.read_bytes()
    assert initialise(str(tmp_path), Limits("main", 1), 0) == "kept"
    assert mine.read_bytes() == made
    at = REGION["minor_version"]["offset"]
    older = made[:at] + (1).to_bytes(4, "little") + made[at + 4 :]
    mine.write_bytes(older)
    with pytest.raises(RegionError, match="the node's shim and this image differ"):
        initialise(str(tmp_path), Limits("main", 4096), 0)
    assert mine.read_bytes() == older
