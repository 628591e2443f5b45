"""``top`` and the node agent against the real API server, with regions planted on "the node".

GPU pods are admitted by the installed webhook (so they carry its status
annotation), bound to a Node and given the extender's annotations, as it
writes them at bind. The node agent runs here, as it would on that node:
it names the regions planted under a temporary pods directory through the
pods the API lists on its node, and serves on this machine's address. Its
pod object (nothing runs pods in this tier) is bound to the node with that
address as its pod IP, so the API server's pod proxy, which refuses
loopback addresses, reaches it there. ``top`` then reads it through that
proxy, as it does in a cluster, and as a kubectl plugin too.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.apiserver.helpers import (
    RESTRICTED,
    cli_json,
    create_namespace,
    create_pod,
    delete_namespaces,
    delete_nodes,
    gpu_container,
    pod_manifest,
    put_node,
    wait_for_service_account,
)
from tests.apiserver.test_report import bind
from tests.conftest import free_port
from tests.controlplane.install import NS, Installed
from tests.regionwriter import Proc, Spec, plant, region
from tests.test_node_metrics import Agent

ML, NODE = "top-ml", "top-gpu-1"
GIB = 2**30


def _address() -> str:
    """An address of this machine other than loopback, which the pod proxy refuses."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            pytest.skip("no route off loopback: the API server's pod proxy refuses loopback")
        return str(probe.getsockname()[0])


def _gpu_pod(installed: Installed, name: str, gpu: str, reserved: str) -> dict[str, Any]:
    created = create_pod(installed.api, ML, pod_manifest(name, gpu_container(gpu="4")))
    bind(installed.plane, ML, name, NODE)
    annotations = {"ALIYUN_COM_GPU_MEM_IDX": gpu, "ALIYUN_COM_GPU_MEM_POD": reserved}
    client.CoreV1Api(installed.api).patch_namespaced_pod(
        name, ML, {"metadata": {"annotations": annotations}}
    )
    return created


def _agent_pod(installed: Installed, address: str) -> None:
    labels = {"app.kubernetes.io/name": "gpushare-webhook-node-agent"}
    body = pod_manifest(
        "agent-top", gpu_container("agent", gpu=None, securityContext=RESTRICTED), labels=labels
    )
    core = client.CoreV1Api(installed.api)
    core.create_namespaced_pod(NS, body)
    bind(installed.plane, NS, "agent-top", NODE)
    status = {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}
    core.patch_namespaced_pod_status("agent-top", NS, {"status": status})


def _top(*args: str, plugin: bool = False) -> tuple[int, dict[str, Any]]:
    return cli_json("top", "-o", "json", "-n", ML, *args, plugin=plugin)


@pytest.fixture
def scene(installed: Installed) -> Iterator[None]:
    """The namespace and node of this test, removed after it, whatever it found."""
    delete_nodes(installed.api)
    try:
        yield
    finally:
        delete_namespaces(installed.api, ML)
        delete_nodes(installed.api)


def test_top_reads_the_node_agent_through_the_pod_proxy(
    installed: Installed, tmp_path: Path, scene: None
) -> None:
    address = _address()
    api, kubeconfig = installed.api, str(installed.plane.kubeconfig)
    create_namespace(api, ML)
    wait_for_service_account(api, ML)
    put_node(api, NODE, memory=32, count=2)
    train = _gpu_pod(installed, "train", "0", "4")
    rogue = _gpu_pod(installed, "rogue", "1", "4")
    idle = _gpu_pod(installed, "idle", "1", "4")
    assert idle["metadata"]["annotations"]["gpushare-webhook.io/status"]
    pods_dir = tmp_path / "pods"
    used = [Proc(used=[3 * GIB], util=[50])]
    plant(pods_dir, train["metadata"]["uid"], "main", region(Spec(procs=used)))
    plant(pods_dir, rogue["metadata"]["uid"], "main", region(Spec(limits=[32 * GIB], procs=used)))
    port = free_port()
    # As in its pod: the node agent's service account token and the cluster's CA where
    # the kubelet mounts them, the API server's address in the environment.
    account = tmp_path / "serviceaccount"
    account.mkdir()
    token = installed.plane.kubectl(
        "create", "token", "gpushare-webhook-node-agent", "-n", NS, "--duration=1h"
    ).stdout.strip()
    (account / "token").write_text(token)
    shutil.copy(installed.plane.ca, account / "ca.crt")
    pod_env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(installed.plane.port),
    }
    agent = Agent(
        tmp_path,
        "--pods-dir", str(pods_dir), "--node", NODE, "--service-account", str(account),
        listen=f"{address}:{port}", env=pod_env,
    )  # fmt: skip
    try:
        scraped = agent.scrape()
        assert 'pod="train"' in scraped, scraped  # named through the API's pods of its node
        _agent_pod(installed, address)
        code, found = _top("--kubeconfig", kubeconfig, "--agent-port", str(port))
        plugin_code, through_plugin = _top(
            "--kubeconfig", kubeconfig, "--agent-port", str(port), plugin=True
        )
        reported = subprocess.run(
            [sys.executable, "-m", "webhook", "report", "-o", "json", "-n", ML,
             "--kubeconfig", kubeconfig, "--agent-port", str(port)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        agent.stop()
    # The report asks the same agents what each pod uses.
    assert reported.returncode == 0, reported.stderr
    used = {p["name"]: p["usedBytes"] for p in json.loads(reported.stdout)["pods"]}
    assert (used["train"], used["rogue"], used["idle"]) == (3 * GIB, 3 * GIB, None)
    rows = {p["pod"]: p for p in found["pods"]}
    assert rows["train"] == {
        "node": NODE, "gpu": 0, "namespace": ML, "pod": "train", "reservedBytes": 4 * GIB,
        "limitBytes": 4 * GIB, "usedBytes": 3 * GIB, "tampered": False, "devices": [],
    }  # fmt: skip
    assert rows["rogue"]["tampered"] is True
    assert rows["idle"]["usedBytes"] is None  # no region yet: nothing ran
    assert found["unreached"] == []
    assert code == 1  # the tampered region
    assert (plugin_code, through_plugin) == (code, found)
    code, found = _top("--kubeconfig", kubeconfig, "--agent-port", str(port))
    assert code == 1  # the agent stopped: its node is named, the rest still shown
    assert found["unreached"] == [
        f"{NODE}: agent {NS}/agent-top: cannot get the metrics of {NS}/agent-top: "
        "HTTP 503 Service Unavailable"
    ]
    assert {p["pod"] for p in found["pods"]} == {"train", "rogue", "idle"}
    client.CoreV1Api(api).delete_namespaced_pod("agent-top", NS, grace_period_seconds=0)
    code, found = _top("--kubeconfig", kubeconfig, "--agent-port", str(port))
    assert found["unreached"] == [f"{NODE}: no node agent runs there"]
    core = client.CoreV1Api(api)  # leave no GPU pod behind for the other tests' reports
    for name in ("train", "rogue", "idle"):
        core.delete_namespaced_pod(name, ML, grace_period_seconds=0)
