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
latency the client measured. A fourth namespace has the webhook and the
guard (the ValidatingAdmissionPolicy of ``policy guard``, bound to it
alone): its creates against the first namespace's are the guard's cost
(the API server times only the checks that fail). A fifth has a policy of
one expression (``true``) with the guard's match instead: what any policy
costs, whatever its expressions. Two more have the floor answering with
a fixed patch that adds the same 36 annotations, in one op or in 36: the
API server's cost per op of a patch, whatever the webhook. The last has
the floor answering as our webhook answers (``--like``: the same patch,
warnings and audit annotations) and registered as ours is (its rules,
matchConditions and reinvocation): against the first namespace, what
the webhook's own work costs a create; against the floor, what our
answer and configuration cost the API server. Pods are deleted after
each round. Not a test: it never fails on a timing.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.run import start
from tests.apiserver.helpers import register_webhook, wait_for_service_account
from tests.conftest import free_port, stop_server
from tests.controlplane import build
from tests.controlplane.cluster import ControlPlane, running
from tests.controlplane.install import Installed, install
from webhook.decision.guard import guard
from webhook.decision.policy import parse_policy_text

HOOK = 'name="pods.gpushare-webhook.io"'
FLOOR_HOOK = 'name="bench-floor.tests.gpushare-webhook.io"'
SENT, FLOOR, UNSENT = "bench-sent", "bench-floor", "bench-unsent"
GUARDED = "bench-guarded"  # our webhook, then the guard (webhook.decision.guard)
TRIVIAL = "bench-trivial"  # our webhook, then a policy of one expression: what any policy costs
ONE_OP, MANY_OPS = "bench-one-op", "bench-many-ops"  # the floor, with one patch in 1 or 36 ops
LIKE_OURS = "bench-like-ours"  # the floor answering and registered as our webhook
PATCH_OPS = 36
NAMESPACES = (SENT, FLOOR, UNSENT, GUARDED, TRIVIAL, ONE_OP, MANY_OPS, LIKE_OURS)
ROOT = Path(__file__).resolve().parent.parent


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


def _create(
    plane: ControlPlane, namespace: str, count: int, concurrency: int, start: int
) -> list[float]:
    """Create ``count`` pods from ``concurrency`` keep-alive connections; latencies in ms."""
    context = plane.context()
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
                failures.append(f"{namespace}: HTTP {response.status}: {body[:600]!r}")
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
    conn = http.client.HTTPSConnection("127.0.0.1", plane.port, context=plane.context(), timeout=60)
    conn.request("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
    conn.getresponse().read()
    conn.close()


def _histogram(metrics: str, hook: str = HOOK) -> tuple[float, dict[float, float]]:
    """(first bucket bound, cumulative counts by bound) of one webhook's admit calls."""
    buckets: dict[float, float] = {}
    pattern = re.compile(
        r"^apiserver_admission_webhook_admission_duration_seconds_bucket\{(.*)\} (\S+)$"
    )
    for line in metrics.splitlines():
        found = pattern.match(line)
        if found and hook in found.group(1) and 'operation="CREATE"' in found.group(1):
            bound = re.search(r'le="([^"]+)"', found.group(1))
            assert bound is not None
            key = float("inf") if bound.group(1) == "+Inf" else float(bound.group(1))
            buckets[key] = buckets.get(key, 0.0) + float(found.group(2))
    first = min(buckets) if buckets else 0.005
    return first, buckets


def _start_floor(
    folder: Path, patch: str = "none", like: str = ""
) -> tuple[subprocess.Popen[bytes], int]:
    """bench/floor.py, the least a webhook can do, with the webhook's own certificate."""
    port = free_port()
    ca = folder / "mounted" / "ca.crt"
    context = ssl.create_default_context(cafile=str(ca))
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "floor.py"),
        f"--bind=127.0.0.1:{port}",
        f"--cert={folder / 'mounted' / 'tls.crt'}",
        f"--key={folder / 'mounted' / 'tls.key'}",
        f"--patch={patch}",
        f"--ops={PATCH_OPS}",
        *([f"--like={like}", f"--like-ca={ca}"] if like else []),
    ]
    # The certificate certs install made names 127.0.0.1, not localhost.
    process, _ = start(cmd, port, context, host="127.0.0.1")
    return process, port


def _register_as_ours(plane: ControlPlane, port: int, namespace: str) -> None:
    """The floor at ``port`` registered as our webhook is, for ``namespace`` alone."""
    stored = plane.kubectl("get", "mutatingwebhookconfiguration", "gpushare-webhook", "-o", "json")
    hook = json.loads(stored.stdout)["webhooks"][0]
    hook["name"] = f"{namespace}.tests.gpushare-webhook.io"
    hook["clientConfig"]["url"] = f"https://127.0.0.1:{port}/mutate"
    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": namespace},
        "webhooks": [hook],
    }
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(config))


def _apply_guard(plane: ControlPlane, installed: Installed) -> None:
    """The guard for the policy the webhook serves, bound to GUARDED only, and beside it
    a policy whose one expression is ``true``, with the same match, bound to TRIVIAL."""
    served = Path(installed.args[installed.args.index("--policy") + 1]).read_text()
    objects = guard(parse_policy_text(served))
    trivial = json.loads(json.dumps(objects[:2]))
    trivial[0]["metadata"]["name"] = trivial[1]["metadata"]["name"] = "bench-trivial"
    trivial[0]["spec"].update(variables=[], auditAnnotations=[])
    trivial[0]["spec"]["validations"] = [{"expression": "true"}]
    trivial[1]["spec"]["policyName"] = "bench-trivial"
    objects += trivial
    for binding, namespace in ((objects[1], GUARDED), (trivial[1], TRIVIAL)):
        selector = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}
        binding["spec"]["matchResources"] = {"namespaceSelector": {"matchExpressions": [selector]}}
    plane.kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(quick: bool) -> dict[str, Any]:
    binaries = build.ensure()
    root = Path(tempfile.mkdtemp(prefix="gpushare-bench-apiserver-"))
    rounds, per_round = (2, 60) if quick else (3, 400)
    results: dict[str, Any] = {}
    floors: list[subprocess.Popen[bytes]] = []
    with running(root / "cluster", binaries) as plane:
        installed = install(plane, root / "webhook", workers=None)  # as deployed
        try:
            for namespace in NAMESPACES:
                plane.kubectl("create", "namespace", namespace)
            _apply_guard(plane, installed)
            for namespace in (FLOOR, UNSENT, ONE_OP, MANY_OPS, LIKE_OURS):
                plane.kubectl(
                    "label", "namespace", namespace, "gpushare-webhook.io/injection=disabled"
                )
            for name, namespace, patch in (
                ("bench-floor", FLOOR, "none"),
                ("bench-one-op", ONE_OP, "one"),
                ("bench-many-ops", MANY_OPS, "many"),
            ):
                process, port = _start_floor(root / "webhook", patch)
                floors.append(process)
                register_webhook(
                    plane,
                    name,
                    port=port,
                    ca_pem=installed.server.ca.read_bytes(),
                    namespace=namespace,
                    path="/mutate",
                )
            ours = f"https://127.0.0.1:{installed.server.port}/mutate"
            process, port = _start_floor(root / "webhook", like=ours)
            floors.append(process)
            _register_as_ours(plane, port, LIKE_OURS)
            for namespace in NAMESPACES:
                wait_for_service_account(installed.api, namespace)
            for namespace in NAMESPACES:  # warm every path
                _create(plane, namespace, 20, 4, 10**6)
                _delete_all(plane, namespace)
            index = 0
            for level in (1, 8, 32):
                latencies: dict[str, list[float]] = {name: [] for name in NAMESPACES}
                count = per_round if level > 1 else per_round // 2
                metrics = plane.metrics()
                before = {hook: _histogram(metrics, hook)[1] for hook in (HOOK, FLOOR_HOOK)}
                for _ in range(rounds):
                    for namespace, into in latencies.items():
                        into.extend(_create(plane, namespace, count, level, index))
                        index += count
                        _delete_all(plane, namespace)
                metrics = plane.metrics()
                shares = {}
                for hook in (HOOK, FLOOR_HOOK):
                    first, after = _histogram(metrics, hook)
                    calls = after.get(float("inf"), 0.0) - before[hook].get(float("inf"), 0.0)
                    inside = after.get(first, 0.0) - before[hook].get(first, 0.0)
                    shares[hook] = (first, int(calls), round(inside / calls, 4) if calls else None)
                sent, floored, unsent = latencies[SENT], latencies[FLOOR], latencies[UNSENT]
                results[str(level)] = {
                    "pods": sum(len(v) for v in latencies.values()),
                    "webhook_calls": shares[HOOK][1],
                    "first_bucket_s": shares[HOOK][0],
                    "webhook_le_5ms_share": shares[HOOK][2],
                    "floor_le_5ms_share": shares[FLOOR_HOOK][2],
                    "create_p50_ms": round(statistics.median(sent), 2),
                    "create_p99_ms": round(_percentile(sent, 0.99), 2),
                    "create_p50_ms_floor": round(statistics.median(floored), 2),
                    "create_p99_ms_floor": round(_percentile(floored, 0.99), 2),
                    "create_p50_ms_without": round(statistics.median(unsent), 2),
                    "create_p99_ms_without": round(_percentile(unsent, 0.99), 2),
                    "create_p50_ms_guarded": round(statistics.median(latencies[GUARDED]), 2),
                    "guarded_to_webhook_p50": round(
                        statistics.median(latencies[GUARDED]) / statistics.median(sent), 3
                    ),
                    "guard_p50_ms": round(
                        statistics.median(latencies[GUARDED]) - statistics.median(sent), 2
                    ),
                    "trivial_policy_p50_ms": round(
                        statistics.median(latencies[TRIVIAL]) - statistics.median(sent), 2
                    ),
                    "create_p50_ms_like_ours": round(statistics.median(latencies[LIKE_OURS]), 2),
                    "create_p50_ms_one_op": round(statistics.median(latencies[ONE_OP]), 2),
                    "create_p50_ms_many_ops": round(statistics.median(latencies[MANY_OPS]), 2),
                    "per_op_us": round(
                        (
                            statistics.median(latencies[MANY_OPS])
                            - statistics.median(latencies[ONE_OP])
                        )
                        * 1000
                        / (PATCH_OPS - 1),
                        1,
                    ),
                }
        finally:
            stop_server(installed.server)
            for process in floors:
                process.terminate()
                process.wait(15)
    return results


def report(results: dict[str, Any]) -> None:
    print("\nthrough kube-apiserver: create latency with our webhook / the floor webhook / none")
    for level, row in results.items():
        print(
            f"  c={level:>2}: {row['pods']} pods, {row['webhook_calls']} calls of ours, "
            f"{row['webhook_le_5ms_share']:.1%} within {row['first_bucket_s'] * 1000:.0f} ms "
            f"(floor {row['floor_le_5ms_share']:.1%}); p50 {row['create_p50_ms']:.2f} / "
            f"{row['create_p50_ms_floor']:.2f} / {row['create_p50_ms_without']:.2f} ms, p99 "
            f"{row['create_p99_ms']:.2f} / {row['create_p99_ms_floor']:.2f} / "
            f"{row['create_p99_ms_without']:.2f} ms"
        )
        print(
            f"        with the guard too: p50 {row['create_p50_ms_guarded']:.2f} ms "
            f"({row['guarded_to_webhook_p50']:.3f} of the webhook alone), "
            f"{row['guard_p50_ms']:+.2f} ms; a policy of one expression "
            f"{row['trivial_policy_p50_ms']:+.2f} ms"
        )
        print(
            f"        the floor with {PATCH_OPS} annotations in one op / in {PATCH_OPS} ops: p50 "
            f"{row['create_p50_ms_one_op']:.2f} / {row['create_p50_ms_many_ops']:.2f} ms, "
            f"{row['per_op_us']:+.1f} us per op"
        )
        like = row["create_p50_ms_like_ours"]
        print(
            f"        the floor answering and registered as ours: p50 {like:.2f} ms; ours "
            f"{row['create_p50_ms'] / like:.3f} of it, it {like / row['create_p50_ms_floor']:.3f} "
            "of the floor"
        )
