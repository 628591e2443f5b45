"""``gpushare-webhook node metrics``: the agent, scraped over HTTP, on planted regions."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.regionwriter import Proc, Spec, plant, region
from webhook.cluster.incluster import in_cluster

GIB = 2**30
STATUS = '{"containers":{"main":{"memory":"4096m"}},"demand":"4GiB"}'


def _pods(path: Path, *names: tuple[str, str]) -> None:
    items = [
        {
            "metadata": {
                "uid": uid,
                "namespace": "ml",
                "name": name,
                "annotations": {"gpushare-webhook.io/status": STATUS},
            }
        }
        for uid, name in names
    ]
    path.write_text(json.dumps({"kind": "PodList", "items": items}))


class Agent:
    def __init__(
        self, tmp: Path, *flags: str, listen: str = "", env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.host = "127.0.0.1"
        if listen:
            self.host, port = listen.rsplit(":", 1)
            self.port = int(port)
        self.log = tmp / f"agent-{self.port}.log"
        command = [sys.executable, "-m", "webhook", "node", "metrics"]
        with self.log.open("wb") as out:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [*command, "--listen", f"{self.host}:{self.port}", *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )

    def scrape(self) -> str:
        deadline = time.monotonic() + 20
        while True:
            try:
                url = f"http://{self.host}:{self.port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    return str(answer.read().decode())
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise AssertionError(self.log.read_text()) from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def plant_node(tmp_path: Path) -> tuple[Path, Path]:
    """A node's pods directory with regions of every kind, and its pods list: (dir, list)."""
    pods_dir, pods = tmp_path / "pods", tmp_path / "pods.json"
    pods_dir.mkdir()
    _pods(pods, ("u1", "train"), ("u2", "rogue"))
    used = Proc(used=[3 * GIB], util=[42])
    plant(pods_dir, "u1", "main", region(Spec(uuids=["GPU-1"], procs=[used, Proc(pid=5)])))
    plant(pods_dir, "u2", "main", region(Spec(limits=[16 * GIB], uuids=["GPU-1"], procs=[used])))
    plant(pods_dir, "u2", "old", region(Spec(minor=1)))
    plant(pods_dir, "u2", "cut", region(Spec())[:100])
    return pods_dir, pods


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path]:
    return plant_node(tmp_path)


def _value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in:\n{text}")


def test_each_container_is_served_with_its_use_limit_and_admitted_limit(
    tmp_path: Path, node: tuple[Path, Path]
) -> None:
    pods_dir, pods = node
    agent = Agent(tmp_path, "--pods-dir", str(pods_dir), "--pods-from", str(pods))
    try:
        text = agent.scrape()
        agent.scrape()  # a second scrape logs the same tampering no second time
    finally:
        agent.stop()
    train = {"namespace": "ml", "pod": "train", "container": "main", "device": "0"}
    assert _value(text, "gpushare_container_gpu_memory_used_bytes", **train) == 3 * GIB
    assert _value(text, "gpushare_container_gpu_memory_limit_bytes", **train) == 4 * GIB
    assert _value(text, "gpushare_container_gpu_memory_admitted_bytes", **train) == 4 * GIB
    assert _value(text, "gpushare_container_gpu_utilization_percent", **train) == 42
    assert _value(text, "gpushare_container_gpu_processes", **train) == 2
    assert _value(text, "gpushare_container_gpu_region_tampered", **train) == 0
    assert _value(text, "gpushare_container_gpu_region_tampered", pod="rogue") == 1
    assert _value(text, "gpushare_node_regions_skipped", reason="version") == 1
    assert _value(text, "gpushare_node_regions_skipped", reason="truncated") == 1
    assert _value(text, "gpushare_node_region_layout_info", version="1.2") == 1
    log = agent.log.read_text()
    assert log.count("tampered region: pod ml/rogue container main device 0") == 1, log


def test_hamis_names_for_its_dashboards(tmp_path: Path, node: tuple[Path, Path]) -> None:
    pods_dir, pods = node
    agent = Agent(
        tmp_path, "--pods-dir", str(pods_dir), "--pods-from", str(pods), "--metric-names", "hami"
    )
    try:
        text = agent.scrape()
    finally:
        agent.stop()
    labels = {"pod": "train", "vdevice_index": "0", "device_uuid": "GPU-1"}
    assert _value(text, "hami_vgpu_memory_used_bytes", **labels) == 3 * GIB
    assert _value(text, "hami_vgpu_memory_limit_bytes", **labels) == 4 * GIB
    assert _value(text, "hami_container_device_utilization_ratio", **labels) == 42
    assert "gpushare_container_gpu_memory_used_bytes" not in text


BAD_FLAGS = {
    "listen": (["--listen", "nowhere"], "--listen 'nowhere': write HOST:PORT"),
    "pods-dir": (["--pods-dir", "/nonexistent"], "--pods-dir /nonexistent: no such directory"),
    "no-node": (["--pods-dir", "."], "no node name: pass --node or set NODE_NAME"),
    "refresh": (["--pods-dir", ".", "--refresh", "0"], "--refresh 0.0: write a number"),
    "pods-from": (["--pods-dir", ".", "--pods-from", "/nonexistent"], "--pods-from /nonexistent"),
}


@pytest.mark.parametrize(("flags", "message"), BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_flags_that_cannot_be_used_get_one_line_and_exit_2(flags: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "node", "metrics", *flags],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert message in line


def test_a_port_it_cannot_listen_on_is_one_line_and_exit_2(tmp_path: Path) -> None:
    pods = tmp_path / "pods.json"
    _pods(pods)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        for listen, message in (
            (f"127.0.0.1:{taken}", f"port {taken} is already in use"),
            ("192.0.2.1:9", "--listen 192.0.2.1:9: cannot listen there"),  # not this host's
        ):
            done = subprocess.run(
                [sys.executable, "-m", "webhook", "node", "metrics", "--pods-dir", str(tmp_path),
                 "--node", "n", "--pods-from", str(pods), "--listen", listen],
                capture_output=True, check=False, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 2
            (line,) = done.stderr.splitlines()
            assert message in line


def test_outside_a_pod_there_is_no_in_cluster_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No service host, or no token: the agent needs --kubeconfig (webhook.cluster.incluster);
    a CA it cannot use is one line. (tests/apiserver/test_top.py lists pods in-cluster.)"""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / "token").write_text("t")
    assert in_cluster(str(tmp_path)) is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    assert in_cluster(str(tmp_path / "elsewhere")) is None  # no token there
    agent_env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "node", "metrics", "--pods-dir", str(tmp_path),
         "--node", "n", "--service-account", str(tmp_path), "--listen", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **agent_env},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("gpushare-webhook: the service account's CA in"), done.stderr
    assert len(done.stderr.splitlines()) == 1
