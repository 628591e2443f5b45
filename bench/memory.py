"""The webhook's memory as deployed: ``serve --watch-nodes`` against the real API server.

    python bench/run.py --memory [--quick]

Starts the tests' control plane (tests/controlplane), installs the webhook
from the manifests and serves it as the Deployment does (two workers,
``--watch-nodes``, the policy and serving pair from the cluster, the
webhook's own ServiceAccount), with GPU nodes in the cluster. Then reads
each process's RSS and PSS (``/proc/PID/smaps_rollup``) at start, after
admission reviews sent to the webhook (100,000; 10,000 with ``--quick``)
and after changes of GPU nodes through the API (1,000; 100 with
``--quick``). PSS counts a page that n processes share as 1/n in each:
summed over the server's processes, it is what the pod costs. Goals:
each worker under 45 MiB RSS, the whole server under 110 MiB PSS, and no
growth across the reviews and the node events. Not a test: it never fails
on a figure.
"""

from __future__ import annotations

import json
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.reviews import mix
from bench.run import trial
from tests.conftest import stop_server
from tests.controlplane import build
from tests.controlplane.cluster import running
from tests.controlplane.install import install

GPU_NODES = 50


def _tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(p for child in children for p in _tree(int(child)))]


def _memory(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Rss", "Pss"):
            fields[key.lower()] = round(int(value.split()[0]) / 1024, 1)
    return fields


def _watch_pid(log: Path) -> int:
    for line in log.read_text().splitlines():
        if '"node watch started"' in line:
            return int(json.loads(line)["pid"])
    raise RuntimeError("the server did not log the node watch's pid")


def _sample(master: int, watch: int) -> dict[str, Any]:
    processes = {}
    for pid in _tree(master):
        role = "master" if pid == master else "watch" if pid == watch else f"worker {pid}"
        processes[role] = _memory(pid)
    workers = [v for k, v in processes.items() if k.startswith("worker")]
    return {
        "processes": processes,
        "pss_total": round(sum(v["pss"] for v in processes.values()), 1),
        "worker_rss_max": max(v["rss"] for v in workers),
    }


def _node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpushare": "true"}},
    }


def _events(core: client.CoreV1Api, count: int) -> None:
    """``count`` changes of GPU nodes: capacity through the status subresource, and labels."""
    for i in range(count):
        name = f"gpu-{i % GPU_NODES}"
        if i % 2:
            core.patch_node(name, {"metadata": {"labels": {"bench-round": str(i)}}})
        else:
            capacity = {"aliyun.com/gpu-mem": str(32 + i % 64), "aliyun.com/gpu-count": "2"}
            core.patch_node_status(name, {"status": {"capacity": capacity}})


def run(quick: bool) -> dict[str, Any]:
    binaries = build.ensure()
    root = Path(tempfile.mkdtemp(prefix="gpushare-bench-memory-"))
    reviews, events = (10_000, 100) if quick else (100_000, 1_000)
    with running(root / "cluster", binaries) as plane:
        installed = install(plane, root / "webhook", workers=None)  # as deployed
        try:
            core = client.CoreV1Api(installed.api)
            for i in range(GPU_NODES):
                core.create_node(_node(f"gpu-{i}"))
                capacity = {"aliyun.com/gpu-mem": "64", "aliyun.com/gpu-count": "2"}
                core.patch_node_status(f"gpu-{i}", {"status": {"capacity": capacity}})
            time.sleep(2)  # the snapshot reaches every worker
            server = installed.server
            master, watch = server.process.pid, _watch_pid(server.log)
            samples = {"start": _sample(master, watch)}
            context = ssl.create_default_context(cafile=str(server.ca))
            sent = trial(server.port, context, mix(200), 8, reviews, host=server.host)
            samples[f"after {sent['requests']} reviews"] = _sample(master, watch)
            _events(core, events)
            time.sleep(2)
            samples[f"after {events} node events"] = _sample(master, watch)
        finally:
            stop_server(installed.server)
    return {"reviews": reviews, "node_events": events, "samples": samples}


def report(results: dict[str, Any]) -> None:
    print("\nmemory as deployed (serve --watch-nodes, 2 workers), MiB")
    for stage, sample in results["samples"].items():
        parts = ", ".join(
            f"{role} {m['rss']:.1f}/{m['pss']:.1f}" for role, m in sample["processes"].items()
        )
        print(
            f"  {stage}: PSS total {sample['pss_total']:.1f}, worker RSS max "
            f"{sample['worker_rss_max']:.1f} (RSS/PSS: {parts})"
        )
