"""Faults while serving: broken policy files, rotated certificates, killed workers, load.

One ``serve`` with two workers reads its policy from a directory laid out as
the kubelet lays out a mounted ConfigMap, and its certificate from files
the tests replace. Whatever happens to them, the webhook keeps answering
with its last good state and says what is wrong.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Server, free_port, start_server, start_watching, stop_server
from tests.helpers import container, eventually, pod, review, swap
from tests.kubeapi import FakeApi, serve
from webhook import tls
from webhook.decision.admission import admit
from webhook.decision.policy import parse_policy
from webhook.decision.prepared import Prepared

JSON = {"Content-Type": "application/json"}
GOOD = "gpuMemory: 24\n"


@dataclass
class Served:
    server: Server
    policy_dir: Path
    certs: Path


def allows_20_gib(server: Server) -> bool:
    return server.ask(pod(container(gpu="20")))["allowed"] is True


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("faults")
    policy_dir = tmp / "policy"
    policy_dir.mkdir()
    swap(policy_dir, GOOD, 1)
    certs = tmp / "certs"
    issued = tls.ensure_certificates(certs, dns_names=["localhost"], ips=["127.0.0.1"])
    running = start_server(
        [
            "--cert", str(issued.cert), "--key", str(issued.key), "--workers", "2",
            "--policy", str(policy_dir / "policy.yaml"),
        ],
        ca=issued.ca,
        log=tmp / "server.log",
        port=free_port(),
    )  # fmt: skip
    yield Served(running, policy_dir, certs)
    stop_server(running)


def test_broken_policy_files_keep_the_last_good_policy(served: Served) -> None:
    server = served.server
    assert allows_20_gib(server)
    assert server.metrics()["gpushare_policy_stale"] == 0
    broken = {  # what is written, and what the log says of it
        "\x00\xff not: [yaml": "at character 1: ",  # then the character, escaped
        'gpuMemory: 24\nshim:\n  hostPath: "/usr/lo': "unexpected end of stream",
        "gpuMemroy: 8\n": "'gpuMemroy' is not known",
    }
    for generation, (text, said) in enumerate(broken.items(), start=2):
        swap(served.policy_dir, text, generation)
        eventually(lambda: server.metrics()["gpushare_policy_stale"] == 1)
        # A review makes the worker look at the file (at most once a second).
        eventually(lambda: allows_20_gib(server) and said in server.log.read_text())  # noqa: B023
        for _ in range(4):  # both workers, whichever answers
            assert allows_20_gib(server)
    (served.policy_dir / "..data").unlink()  # deleted: the mount is briefly empty
    time.sleep(1.5)
    for _ in range(4):
        assert allows_20_gib(server)
    assert server.metrics()["gpushare_policy_stale"] == 1
    log = server.log.read_text()
    assert "policy not reloaded, keeping the last good one" in log
    assert "no such policy file" in log
    assert "Traceback" not in log

    swap(served.policy_dir, "gpuMemory: 16\n", 9)  # a good policy again: applied everywhere
    eventually(lambda: all(not allows_20_gib(server) for _ in range(20)))
    eventually(lambda: server.metrics()["gpushare_policy_stale"] == 0)
    swap(served.policy_dir, GOOD, 10)
    eventually(lambda: all(allows_20_gib(server) for _ in range(20)))


def test_certificates_rotated_or_briefly_missing_keep_serving(served: Served) -> None:
    server = served.server
    old_ca = served.certs / "ca.crt"
    kept = served.certs.parent / "kept-ca.crt"
    shutil.copy(old_ca, kept)
    cert, key = served.certs / "tls.crt", served.certs / "tls.key"
    aside = served.certs.parent / "aside"
    aside.mkdir()
    shutil.copy(cert, aside / "original.crt")
    shutil.copy(key, aside / "original.key")
    cert.rename(aside / cert.name)
    key.rename(aside / key.name)
    time.sleep(1.5)
    assert allows_20_gib(server)  # still the old pair, from memory
    (aside / cert.name).rename(cert)
    (aside / key.name).rename(key)

    # A whole new CA and pair, written in place: new connections get the new pair.
    fresh = served.certs.parent / "fresh"
    issued = tls.ensure_certificates(fresh, dns_names=["localhost"], ips=["127.0.0.1"])
    shutil.copy(issued.key, key)
    shutil.copy(issued.cert, cert)
    rotated = Server(server.process, server.port, issued.ca, server.log)

    def verifies(by: Server) -> bool:
        try:
            return allows_20_gib(by)
        except ssl.SSLError:
            return False

    # Each worker picks up the new pair on its own, within a second or so.
    eventually(lambda: all(verifies(rotated) for _ in range(20)))
    old = Server(server.process, server.port, kept, server.log)
    assert not any(verifies(old) for _ in range(20))

    shutil.copy(aside / "original.key", key)  # and back, for the tests that follow
    shutil.copy(aside / "original.crt", cert)
    eventually(lambda: all(verifies(server) for _ in range(20)))
    assert "Traceback" not in server.log.read_text()


def workers(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return sorted(int(pid) for pid in children)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_killed_worker_is_replaced_and_the_other_keeps_answering(served: Served) -> None:
    server = served.server
    eventually(lambda: len(workers(server.process.pid)) == 2)  # both forked
    before = workers(server.process.pid)
    answered = [0]
    failed: list[float] = []  # when each failed request was sent
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                assert allows_20_gib(server)
                answered[0] += 1
            except (OSError, AssertionError, http.client.HTTPException):
                failed.append(sent)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        killed = time.monotonic()
        os.kill(before[0], signal.SIGKILL)
        mark = answered[0]
        eventually(lambda: answered[0] > mark + 50)  # the other worker never stopped
        eventually(lambda: before[0] not in workers(server.process.pid))
        gone = time.monotonic()  # reaped: its listening socket is closed
        eventually(lambda: len(workers(server.process.pid)) == 2)
        time.sleep(0.5)  # requests go on to both workers
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    # Only requests sent while the dead worker's socket lingered may fail:
    # those in flight on it, and (SO_REUSEPORT) connections the kernel
    # queued on its socket before the process was torn down.
    assert all(killed - 1.0 < sent < gone for sent in failed), (killed, gone, failed)
    replacement = (set(workers(server.process.pid)) - set(before)).pop()
    eventually(lambda: rss_mib(replacement) > 0)
    for _ in range(8):
        assert allows_20_gib(server)


def expected(body: bytes) -> dict[str, object]:
    result = admit(body, Prepared(parse_policy({"gpuMemory": 24})))
    if result.status != 200:
        return {"status": result.status}
    return dict(json.loads(result.encode())["response"])  # as it goes on the wire


def mixed_bodies() -> list[bytes]:
    bodies: list[bytes] = []
    for i in range(40):
        size = ["1", "4", "24", "25", "0", "2Gi", "1.5"][i % 7]
        main = container(gpu=size, env=[{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1m"}])
        bodies.append(json.dumps(review(pod(main, container("sidecar")), uid=f"u-{i}")).encode())
        bodies.append(json.dumps(review(pod(container("web")), uid=f"n-{i}")).encode())
    bodies += [b"{not json", b'{"kind": "AdmissionReview"}', b"[]"]
    return bodies


def test_bounded_load_has_no_errors_no_wrong_decisions_and_flat_memory(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    server = served.server
    bodies = mixed_bodies()
    wanted = [expected(body) for body in bodies]
    requests, concurrency = 10000, 16
    errors: list[str] = []
    done = [0]
    lock = threading.Lock()

    def client(offset: int, count: int) -> None:
        conn = server.connect()
        for n in range(count):
            index = (offset * 7 + n) % len(bodies)
            try:
                conn.request("POST", "/mutate", bodies[index], JSON)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, ConnectionError) as error:
                errors.append(f"{index}: {error!r}")
                conn.close()
                conn = server.connect()
                continue
            got = {"status": resp.status} if resp.status != 200 else json.loads(data)["response"]
            if resp.status >= 500:
                errors.append(f"{index}: HTTP {resp.status}")
            elif got != wanted[index]:
                errors.append(f"{index}: {got} != {wanted[index]}")
            with lock:
                done[0] += 1
        conn.close()

    def run(total: int) -> float:
        started = time.monotonic()
        threads = [
            threading.Thread(target=client, args=(i, total // concurrency))
            for i in range(concurrency)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        return time.monotonic() - started

    run(800)  # warm up: imports, allocator pools, every code path once
    start = {pid: rss_mib(pid) for pid in workers(server.process.pid)}
    elapsed = run(requests)
    end = {pid: rss_mib(pid) for pid in workers(server.process.pid)}
    assert errors == []
    assert done[0] == 800 + requests
    growth = max(end[pid] - start[pid] for pid in start if pid in end)
    with capsys.disabled():
        print(
            f"\nload: {requests} reviews at concurrency {concurrency} in {elapsed:.1f} s, "
            f"worker RSS {max(start.values()):.1f} -> {max(end.values()):.1f} MiB",
            file=sys.stderr,
        )
    assert growth < 5, f"worker RSS grew {growth:.1f} MiB over {requests} reviews"


def test_kubernetes_api_down_slow_or_failing_keeps_the_last_nodes(
    tmp_path: Path, pki: tls.Issued
) -> None:
    with serve(tmp_path) as (api, kubeconfig):
        api.put_node("a100-1", memory=80, count=2)
        with start_watching(pki, kubeconfig, tmp_path / "server.log", workers=1) as server:
            assert server.ask(pod(container(gpu="40")))["allowed"] is True
            assert server.metrics()["gpushare_node_watch_connected"] == 1
            broken(api)
            api.put_node("t4-1", memory=16, count=1)  # an event: the open watch is cut
            eventually(lambda: server.metrics()["gpushare_node_watch_connected"] == 0)
            for _ in range(3):  # last known nodes: 40 GiB still fits, 41 does not
                assert server.ask(pod(container(gpu="40")))["allowed"] is True
                assert server.ask(pod(container(gpu="41")))["allowed"] is False
            assert server.metrics()["gpushare_gpu_sizes_from_policy"] == 0
            assert "node watch:" in server.log.read_text()
            healed(api)
            eventually(lambda: server.metrics()["gpushare_node_watch_connected"] == 1, 45)
            eventually(lambda: server.metrics()["gpushare_gpu_nodes"] == 2)


def broken(api: FakeApi) -> None:
    api.break_watch_after = 0
    api.fail_next = 10**9
    api.delay = 0.5


def healed(api: FakeApi) -> None:
    api.break_watch_after = None
    api.fail_next = 0
    api.delay = 0.0
