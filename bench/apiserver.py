"""What a cluster sees: pod creates through the real kube-apiserver, with and without the webhook.

    python bench/run.py --apiserver [--quick]

Starts the tests' control plane (tests/controlplane: etcd, kube-apiserver,
kube-controller-manager, built once into a cache) with the webhook
installed from the manifests, then creates GPU pods at concurrency 1, 8
and 32, alternating rounds in a namespace the webhook is called for and
in one its namespaceSelector leaves out (``gpushare-webhook.io/injection:
disabled``): the same API server, pods and client, the webhook called or
not. Reports the API server's own histogram of our webhook's calls
(``apiserver_admission_webhook_admission_duration_seconds``: the share in
its first bucket, whose bound is read from the histogram) and the create
latency the client measured. Pods are deleted after each round. Not a
test: it never fails on a timing.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import stop_server
from tests.controlplane import build
from tests.controlplane.cluster import ControlPlane, running
from tests.controlplane.install import install

HOOK = 'name="pods.gpushare-webhook.io"'
SENT, UNSENT = "bench-sent", "bench-unsent"


def _pod(index: int) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"bench-{index}"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                        "resources": {"limits": {"aliyun.com/gpu-mem": "4"}},
                    }
                ]
            },
        }
    ).encode()


def _context(plane: ControlPlane) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(plane.ca))
    cert, key = plane.admin
    context.load_cert_chain(str(cert), str(key))
    return context


def _create(
    plane: ControlPlane, namespace: str, count: int, concurrency: int, start: int
) -> list[float]:
    """Create ``count`` pods from ``concurrency`` keep-alive connections; latencies in ms."""
    context = _context(plane)
    latencies: list[float] = []
    lock = threading.Lock()
    next_index = [start]
    failures: list[str] = []

    def worker() -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", plane.port, context=context, timeout=30)
        mine: list[float] = []
        while True:
            with lock:
                if next_index[0] >= start + count:
                    break
                index = next_index[0]
                next_index[0] += 1
            began = time.perf_counter()
            conn.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                body=_pod(index),
                headers={"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            body = response.read()
            mine.append((time.perf_counter() - began) * 1000)
            if response.status != 201:
                failures.append(f"HTTP {response.status}: {body[:200]!r}")
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} creates failed, first: {failures[0]}")
    return latencies


def _delete_all(plane: ControlPlane, namespace: str) -> None:
    conn = http.client.HTTPSConnection("127.0.0.1", plane.port, context=_context(plane), timeout=60)
    conn.request("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
    conn.getresponse().read()
    conn.close()


def _histogram(metrics: str) -> tuple[float, dict[float, float]]:
    """(first bucket bound, cumulative counts by bound) of our webhook's admit calls."""
    buckets: dict[float, float] = {}
    pattern = re.compile(
        r"^apiserver_admission_webhook_admission_duration_seconds_bucket\{(.*)\} (\S+)$"
    )
    for line in metrics.splitlines():
        found = pattern.match(line)
        if found and HOOK in found.group(1) and 'operation="CREATE"' in found.group(1):
            bound = re.search(r'le="([^"]+)"', found.group(1))
            assert bound is not None
            key = float("inf") if bound.group(1) == "+Inf" else float(bound.group(1))
            buckets[key] = buckets.get(key, 0.0) + float(found.group(2))
    first = min(buckets) if buckets else 0.005
    return first, buckets


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(quick: bool) -> dict[str, Any]:
    binaries = build.ensure()
    root = Path(tempfile.mkdtemp(prefix="gpushare-bench-apiserver-"))
    rounds, per_round = (2, 60) if quick else (3, 400)
    results: dict[str, Any] = {}
    with running(root / "cluster", binaries) as plane:
        installed = install(plane, root / "webhook", workers=None)  # as deployed
        try:
            plane.kubectl("create", "namespace", SENT)
            plane.kubectl("create", "namespace", UNSENT)
            plane.kubectl("label", "namespace", UNSENT, "gpushare-webhook.io/injection=disabled")
            for namespace in (SENT, UNSENT):
                deadline = time.monotonic() + 30
                while plane.kubectl(
                    "get", "serviceaccount", "default", "-n", namespace, check=False
                ).returncode:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no default ServiceAccount in {namespace}")
                    time.sleep(0.2)
            _create(plane, SENT, 20, 4, 10**6)  # warm both paths
            _create(plane, UNSENT, 20, 4, 10**6)
            _delete_all(plane, SENT)
            _delete_all(plane, UNSENT)
            index = 0
            for level in (1, 8, 32):
                sent: list[float] = []
                unsent: list[float] = []
                count = per_round if level > 1 else per_round // 2
                before = _histogram(plane.metrics())[1]
                for _ in range(rounds):
                    for namespace, into in ((SENT, sent), (UNSENT, unsent)):
                        into.extend(_create(plane, namespace, count, level, index))
                        index += count
                        _delete_all(plane, namespace)
                first, after = _histogram(plane.metrics())
                calls = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
                inside = after.get(first, 0.0) - before.get(first, 0.0)
                results[str(level)] = {
                    "pods": len(sent) + len(unsent),
                    "webhook_calls": int(calls),
                    "first_bucket_s": first,
                    "webhook_le_5ms_share": round(inside / calls, 4) if calls else None,
                    "create_p50_ms": round(statistics.median(sent), 2),
                    "create_p99_ms": round(_percentile(sent, 0.99), 2),
                    "create_p50_ms_without": round(statistics.median(unsent), 2),
                    "create_p99_ms_without": round(_percentile(unsent, 0.99), 2),
                }
        finally:
            stop_server(installed.server)
    return results


def report(results: dict[str, Any]) -> None:
    print("\nthrough kube-apiserver (webhook called / namespace left out):")
    for level, row in results.items():
        share = row["webhook_le_5ms_share"]
        print(
            f"  c={level:>2}: {row['pods']} pods, {row['webhook_calls']} webhook calls, "
            f"{share:.1%} within {row['first_bucket_s'] * 1000:.0f} ms; create p50 "
            f"{row['create_p50_ms']:.2f} / {row['create_p50_ms_without']:.2f} ms "
            f"({row['create_p50_ms'] / row['create_p50_ms_without']:.2f}x), p99 "
            f"{row['create_p99_ms']:.2f} / {row['create_p99_ms_without']:.2f} ms",
            file=sys.stdout,
        )
