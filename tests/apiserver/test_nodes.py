"""``serve --watch-nodes`` against the real API server, with the manifests' RBAC.

Nodes are created with GPU capacity set through the status subresource, as
a device plugin's kubelet would report it. Decisions are read through the
API server itself: a server-side dry-run create calls the webhook
(sideEffects: None) and stores nothing.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.apiserver.helpers import (
    create_namespace,
    delete_namespaces,
    delete_nodes,
    gpu_container,
    pod_manifest,
    process_tree,
    put_node,
    wait_for_service_account,
)
from tests.controlplane.install import Installed
from tests.helpers import eventually

NAMESPACE = "node-watch"


def fits(api: client.ApiClient, gpu: int) -> bool:
    """Would the API server admit a pod asking ``gpu`` GiB? (dry run: nothing is stored)."""
    core = client.CoreV1Api(api)
    body: dict[str, Any] = pod_manifest("probe", gpu_container(gpu=str(gpu)))
    try:
        core.create_namespaced_pod(NAMESPACE, body, dry_run="All")
    except ApiException as error:
        message = json.loads(error.body)["message"]
        assert "the largest GPU has" in message, message
        return False
    return True


@pytest.fixture(scope="module")
def watched(installed: Installed) -> Iterator[Installed]:
    create_namespace(installed.api, NAMESPACE)
    wait_for_service_account(installed.api, NAMESPACE)
    yield installed
    delete_nodes(installed.api, seen_by=installed.server)
    delete_namespaces(installed.api, NAMESPACE)


def test_decisions_follow_nodes_added_changed_and_deleted(watched: Installed) -> None:
    api = watched.api
    eventually(lambda: not fits(api, 17))  # no GPU node known: the policy's 16 GiB
    assert fits(api, 16)
    put_node(api, "a100-1", memory=160, count=2)  # 80 GiB per GPU
    eventually(lambda: fits(api, 80))
    assert not fits(api, 81)
    put_node(api, "a100-1", memory=80, count=2)  # the same node, now 40 GiB per GPU
    eventually(lambda: not fits(api, 41))
    put_node(api, "t4-1", memory=16, count=1)
    client.CoreV1Api(api).delete_node("a100-1")
    eventually(lambda: not fits(api, 17))
    assert fits(api, 16)


def test_the_watch_resumes_after_the_api_server_restarts_past_it(watched: Installed) -> None:
    """etcd compacted and the API server restarted under a held watch: it resumes.

    The webhook's resourceVersion is older than anything the new API
    server's watch cache holds, so resuming from it is refused and the
    webhook lists again; the change made meanwhile must reach its decisions.
    """
    api, plane = watched.api, watched.plane
    put_node(api, "l40-1", memory=48, count=1)
    eventually(lambda: fits(api, 48))
    pids = process_tree(watched.server.process.pid)
    for pid in pids:  # hold the webhook still, so it resumes only once the API is back
        os.kill(pid, signal.SIGSTOP)
    try:
        plane.compact_etcd()
        plane.restart_apiserver()
        put_node(api, "h100-1", memory=94, count=1)  # a change the old watch never saw
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    eventually(lambda: fits(api, 94), timeout=60)
    assert watched.server.metrics()["gpushare_node_watch_connected"] == 1


def test_a_gpu_node_without_the_shim_sizes_no_pod(watched: Installed) -> None:
    """The shipped policy requires the shim's label: a node without it sizes no pod."""
    api = watched.api
    delete_nodes(api, seen_by=watched.server)  # the nodes the tests above left
    try:
        put_node(api, "bare-1", memory=160, count=2, shim=False)  # 80 GiB per GPU, no shim
        put_node(api, "l4-1", memory=24, count=1)  # seen after the bare node: the watch is ordered
        eventually(lambda: fits(api, 24))
        assert not fits(api, 25)
    finally:
        delete_nodes(api, seen_by=watched.server)
