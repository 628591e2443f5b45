"""The node side's footprint: the agent's RSS and scrape CPU, and a GPU pod's init step.

64 GPU containers' regions (4 processes each, 1 GPU) planted under a
temporary pods directory, named through a saved pod list. ``scrape_ms`` is
the CPU one scrape costs in process (scan, parse, exposition text),
median of many; ``rss_mib`` is the agent process's resident memory after
1,000 scrapes over HTTP, next to a bare prometheus_client HTTP server's
(``rss_baseline_mib``) in the same run. ``init_ms`` and ``init_rss_mib`` are
the init step's (``node init-regions`` writing 8 regions, a pod's worth):
wall-clock time and peak RSS of the process, median of several, next to
``python -c pass`` started the same way (``python_ms``, ``python_rss_mib``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from tests.conftest import free_port
from tests.regionwriter import Proc, Spec, plant, region
from webhook.node.exporter import Names, RegionCollector

CONTAINERS = 64
STATUS = '{"containers":{"main":{"memory":"4096m"}}}'


def _plant(root: Path) -> tuple[Path, Path]:
    pods_dir, pods = root / "pods", root / "pods.json"
    data = region(Spec(procs=[Proc(pid=10 + i, used=[2**28], util=[5]) for i in range(4)]))
    items = []
    for i in range(CONTAINERS):
        uid = f"00000000-0000-0000-0000-{i:012d}"
        plant(pods_dir, uid, "main", data)
        meta = {"uid": uid, "namespace": "bench", "name": f"pod-{i}"}
        items.append({"metadata": {**meta, "annotations": {"gpushare-webhook.io/status": STATUS}}})
    pods.write_text(json.dumps({"items": items}))
    return pods_dir, pods


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        body: bytes = answer.read()
        return body


def _ready(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _scrape(port)
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the agent did not start") from None
            time.sleep(0.1)


def _served_rss(command: list[str], port: int, scrapes: int) -> float:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _ready(port, process)
        for _ in range(scrapes):
            _scrape(port)
        return _rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=10)


# Peak RSS is read as VmHWM at exit, in the process: a child's ru_maxrss would
# count the forking bench's own memory, which the kernel carries across exec.
_PEAK = (
    "import sys\n{}\n"
    "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
    "print(hwm, file=sys.stderr)\nraise SystemExit(code)"
)
_STEP = _PEAK.format("from webhook.cli import main\ncode = main(sys.argv[1:])")
_BARE = _PEAK.format("code = 0")


def _started(code: str, args: list[str]) -> tuple[float, float]:
    """Wall-clock ms and peak RSS (MiB) of one Python process running ``code``, start to exit."""
    start = time.perf_counter()
    ran = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    took = (time.perf_counter() - start) * 1000
    if ran.returncode != 0:
        raise RuntimeError(f"the init step exited {ran.returncode}: {ran.stderr.strip()}")
    return took, int(ran.stderr.split()[-1]) / 1024


def _init_step(root: Path, rounds: int) -> dict[str, float]:
    regions = [f"c{i}=4096m,sm=30" for i in range(8)]
    steps, bare = [], []
    for n in range(rounds):
        folder = root / f"accounting-{n}"
        folder.mkdir()
        steps.append(_started(_STEP, ["node", "init-regions", "--dir", str(folder), *regions]))
        bare.append(_started(_BARE, []))
    return {
        "init_ms": round(statistics.median(ms for ms, _ in steps), 1),
        "init_rss_mib": round(statistics.median(rss for _, rss in steps), 1),
        "python_ms": round(statistics.median(ms for ms, _ in bare), 1),
        "python_rss_mib": round(statistics.median(rss for _, rss in bare), 1),
    }


def run(quick: bool) -> dict[str, Any]:
    scrapes, timed = (100, 20) if quick else (1000, 200)
    with tempfile.TemporaryDirectory() as tmp:
        pods_dir, pods = _plant(Path(tmp))
        collector = RegionCollector(
            pods_dir, lambda: json.loads(pods.read_text())["items"], names=Names.GPUSHARE
        )
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        assert b'pod="pod-63"' in generate_latest(registry)
        cpu = []
        for _ in range(timed):
            start = time.process_time()
            generate_latest(registry)
            cpu.append((time.process_time() - start) * 1000)
        port = free_port()
        agent = [
            sys.executable,
            "-m",
            "webhook",
            "node",
            "metrics",
            "--pods-dir",
            str(pods_dir),
            "--pods-from",
            str(pods),
            "--listen",
            f"127.0.0.1:{port}",
        ]
        rss = _served_rss(agent, port, scrapes)
        port = free_port()
        bare = [
            sys.executable,
            "-c",
            "import time; from prometheus_client import "
            f"start_http_server as s; s({port}, addr='127.0.0.1'); time.sleep(600)",
        ]
        baseline = _served_rss(bare, port, scrapes)
        init = _init_step(Path(tmp), 3 if quick else 11)
    return {
        "containers": CONTAINERS,
        "scrapes": scrapes,
        "scrape_ms": round(statistics.median(cpu), 2),
        "rss_mib": round(rss, 1),
        "rss_baseline_mib": round(baseline, 1),
        **init,
    }


def report(found: dict[str, Any]) -> None:
    print(
        f"node agent: {found['scrape_ms']} ms CPU per scrape of {found['containers']} regions "
        f"(median); RSS {found['rss_mib']} MiB after {found['scrapes']} scrapes "
        f"(a bare prometheus_client server: {found['rss_baseline_mib']} MiB)"
    )
    print(
        f"init step: {found['init_ms']} ms and {found['init_rss_mib']} MiB peak RSS to write 8 "
        f"regions (python -c pass: {found['python_ms']} ms, {found['python_rss_mib']} MiB)"
    )
