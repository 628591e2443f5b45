"""``serve --watch-nodes`` with two workers against the real API server, and what it reports.

One webhook process with two workers and one node watch process that
shares what it knows with both, reviews sent straight to it: the decision
follows the Nodes as they change, only the watch talks to the API server,
/metrics adds up both workers, every admission is one JSON log line, and
a watch that dies fails the liveness probe but keeps the nodes it knew.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.apiserver.helpers import (
    connected_to,
    delete_nodes,
    process_tree,
    put_node,
    watch_pid,
)
from tests.conftest import Server, free_port, start_server, start_watching, stop_server
from tests.controlplane.install import Installed, service_account_kubeconfig
from tests.helpers import container, eventually, pod
from webhook import tls

JSON = {"Content-Type": "application/json"}
Cluster = tuple[client.ApiClient, Server]


@pytest.fixture(scope="module")
def cluster(
    installed: Installed, tmp_path_factory: pytest.TempPathFactory, pki: tls.Issued
) -> Iterator[Cluster]:
    api = installed.api
    put_node(api, "t4-1", memory=16, count=1, labels={"pool": "t4"})
    put_node(api, "a100-1", memory=80, count=2, labels={"pool": "a100"})
    put_node(api, "a100-2", memory=80, count=2, labels={"pool": "a100"})
    log = tmp_path_factory.mktemp("watching") / "server.log"
    running = start_watching(pki, installed.webhook_kubeconfig, log)
    try:
        yield api, running
    finally:
        stop_server(running)
        delete_nodes(api, seen_by=installed.server)


def test_rejects_against_the_largest_gpu_in_the_cluster(cluster: Cluster) -> None:
    _, server = cluster
    # Each worker reads the snapshot itself: ask enough times to reach both.
    for _ in range(4):
        eventually(lambda: server.ask(pod(container(gpu="40")))["allowed"] is True)
        answer = server.ask(pod(container(gpu="41")))
        assert answer["allowed"] is False
        message = answer["status"]["message"]  # type: ignore[index]
        assert "the largest GPU has 40 GiB (2 nodes of the cluster's GPU nodes)" in message


def test_node_pool_selection_narrows_the_bound(cluster: Cluster) -> None:
    _, server = cluster
    answer = server.ask(pod(container(gpu="20"), nodeSelector={"pool": "t4"}))
    assert answer["allowed"] is False
    assert "16 GiB (1 node of the GPU nodes this pod's node selector allows)" in str(answer)


def test_a_new_node_raises_the_bound_without_a_restart(cluster: Cluster) -> None:
    api, server = cluster
    put_node(api, "h100-1", memory=94, count=1, labels={"pool": "h100"})
    for _ in range(4):
        eventually(lambda: server.ask(pod(container(gpu="94")))["allowed"] is True)
    client.CoreV1Api(api).delete_node("h100-1")
    for _ in range(4):
        eventually(lambda: server.ask(pod(container(gpu="94")))["allowed"] is False)


def test_metrics_add_up_both_workers(cluster: Cluster) -> None:
    _, server = cluster
    rejected = 'gpushare_admission_reviews_total{outcome="rejected",reason="exceeds-gpu"}'
    bad = 'gpushare_admission_reviews_total{outcome="bad-request",reason="bad-request"}'
    pods = 'gpushare_admitted_gpu_pods_total{namespace="quota-test"}'
    memory = 'gpushare_admitted_gpu_memory_bytes_total{namespace="quota-test"}'
    answered = "gpushare_admission_duration_seconds_count"
    # Start from counts that hold still for longer than a flush: earlier
    # tests' reviews are all in them by then.
    watched = (rejected, bad, pods, memory, answered)
    settled: list[dict[str, float]] = [server.metrics()]

    def still() -> bool:
        time.sleep(0.5)  # settled: two scrapes half a second apart agree
        settled.append(server.metrics())
        return all(settled[-1].get(n, 0) == settled[-2].get(n, 0) for n in watched)

    eventually(still, 15)
    before = settled[-1]
    for _ in range(10):  # fresh connections: the kernel spreads them over the workers
        server.ask(pod(container(gpu="99")))
        server.ask(pod(container(gpu="3"), container("b", gpu="2")), namespace="quota-test")
    server.ask(pod(container(gpu="3")), namespace="quota-test")
    server.request("POST", "/mutate", b"{", JSON)
    expected = {rejected: 10, bad: 1, pods: 11, memory: (10 * 5 + 3) * 2**30, answered: 22}

    # A worker adds its tally to the shared counts within a second, with or
    # without more traffic; until every worker has, a scrape shows a partial
    # sum, so wait for all of the counts, not for one of them.
    def added(scrape: dict[str, float]) -> dict[str, float]:
        return {name: scrape.get(name, 0) - before.get(name, 0) for name in expected}

    deadline = time.monotonic() + 5
    while added(after := server.metrics()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert added(after) == expected
    assert after["gpushare_gpu_nodes"] == 3
    assert after["gpushare_largest_gpu_memory_bytes"] == 40 * 2**30
    assert after["gpushare_gpu_sizes_from_policy"] == 0
    assert after["gpushare_node_watch_connected"] == 1
    assert after["gpushare_policy_stale"] == 0
    assert after["gpushare_certificate_expiry_timestamp_seconds"] > time.time() + 86400


def test_one_json_log_line_per_admission(cluster: Cluster) -> None:
    _, server = cluster
    obj = pod(container(gpu="2"))
    obj["metadata"] = {"generateName": "train-", "namespace": "team-a"}
    server.ask(obj, uid="log-line-uid")
    line: dict[str, object] = {}

    def logged() -> bool:
        for raw in server.log.read_text().splitlines():
            if "log-line-uid" in raw:
                line.update(json.loads(raw))
                return True
        return False

    eventually(logged)
    assert line["message"] == "admission"
    assert line["level"] == "info"
    assert (line["uid"], line["namespace"], line["pod"]) == ("log-line-uid", "team-a", "train-")
    assert (line["decision"], line["reason"], line["gpu_memory_per_gpu"]) == (
        "mutated",
        "mutated",
        2,
    )
    assert isinstance(line["duration_ms"], float)
    assert "spec" not in json.dumps(line)  # never the pod itself
    # gunicorn's own lines come out as JSON too.
    for raw in server.log.read_text().splitlines():
        if raw.startswith("{"):
            json.loads(raw)
        else:
            assert re.match(r"gpushare-webhook: development", raw) or not raw.strip(), raw


def test_without_nodes_the_policy_bounds_and_a_warning_says_so(
    installed: Installed, tmp_path: Path, pki: tls.Issued
) -> None:
    """A ServiceAccount the node RBAC does not cover: the API server's 403 reaches the answer."""
    kubeconfig = service_account_kubeconfig(installed.plane, "default", tmp_path)
    with start_server(
        ["--cert", str(pki.cert), "--key", str(pki.key), "--workers", "1",
         "--watch-nodes", "--kubeconfig", str(kubeconfig)],
        ca=pki.ca,
        log=tmp_path / "server.log",
        port=free_port(),
    ) as running:  # fmt: skip
        answer = running.ask(pod(container(gpu="8")))
        assert answer["allowed"] is True
        (warning,) = answer["warnings"]  # type: ignore[misc]
        assert warning.startswith("GPU sizes come from the policy's gpuMemory (16 GiB)")
        assert "forbidden to list or watch nodes" in warning  # ready waits for the first list
        values = running.metrics()
        assert values["gpushare_gpu_sizes_from_policy"] == 1
        assert values["gpushare_gpu_size_fallback_reviews_total"] >= 1
        assert values["gpushare_node_watch_connected"] == 0
        assert "forbidden to list or watch nodes" in running.log.read_text()


def test_one_watch_for_the_server_in_a_process_of_its_own(
    installed: Installed, cluster: Cluster
) -> None:
    """Workers and master never talk to the API server: the one watch process does."""
    _, server = cluster
    watch = watch_pid(server.log)
    processes = process_tree(server.process.pid)
    assert watch in processes
    assert len(processes) == 4  # master, watch, two workers
    port = int(installed.plane.url.rsplit(":", 1)[1])
    eventually(lambda: connected_to(port, processes) == {watch})


def test_a_node_selector_narrows_what_is_watched(
    installed: Installed, cluster: Cluster, tmp_path: Path, pki: tls.Issued
) -> None:
    with start_watching(
        pki, installed.webhook_kubeconfig, tmp_path / "server.log", "--node-selector=pool=t4"
    ) as running:
        assert running.metrics()["gpushare_nodes_known"] == 1
        answer = running.ask(pod(container(gpu="17")))
        assert answer["allowed"] is False
        assert "the largest GPU has 16 GiB (1 node of the cluster's GPU nodes)" in str(answer)


def test_a_dead_watch_fails_liveness_and_keeps_the_nodes_it_knew(
    installed: Installed, cluster: Cluster, tmp_path: Path, pki: tls.Issued
) -> None:
    with start_watching(pki, installed.webhook_kubeconfig, tmp_path / "server.log") as running:
        assert running.request("GET", "/healthz")[0] == 200
        os.kill(watch_pid(running.log), signal.SIGKILL)
        eventually(lambda: running.request("GET", "/healthz")[0] == 503)
        status, body = running.request("GET", "/healthz")
        assert status == 503
        assert json.loads(body)["reason"] == (
            "the node watch process has stopped; restart the server"
        )
        for _ in range(4):  # both workers: the nodes known before stay in force
            answer = running.ask(pod(container(gpu="41")))
            assert "the largest GPU has 40 GiB (2 nodes of the cluster's GPU nodes)" in str(answer)
        values = running.metrics()
        assert values["gpushare_node_watch_connected"] == 0
        assert values["gpushare_gpu_sizes_from_policy"] == 0


def test_the_watch_ends_with_its_server(
    installed: Installed, cluster: Cluster, tmp_path: Path, pki: tls.Issued
) -> None:
    """Killed without a chance to stop it, the server leaves no watch behind."""
    running = start_watching(pki, installed.webhook_kubeconfig, tmp_path / "server.log")
    watch = watch_pid(running.log)
    running.process.kill()
    running.process.wait()

    def gone() -> bool:
        try:
            os.kill(watch, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{watch}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "Z"  # ended, its parent gone with it

    eventually(gone, 10)
