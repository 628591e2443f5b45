"""The node watch, in process, against the real API server.

The same ``NodeWatcher`` a worker runs, with the webhook's ServiceAccount
token and so the RBAC of the manifests. What only a stand-in can produce
on demand (HTTP 500s, a delay of a set length, a stream cut after a given
number of events) stays in tests/test_nodes.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apiserver.helpers import delete_nodes, put_node
from tests.controlplane.install import Installed, service_account_kubeconfig
from tests.helpers import eventually
from webhook.cluster import informer, kube
from webhook.decision.nodesource import prepare
from webhook.decision.policy import DEFAULT_POLICY as GIB
from webhook.decision.prepared import Prepared


def start(kubeconfig: Path) -> informer.NodeWatcher:
    return informer.NodeWatcher(
        lambda: kube.api_client(str(kubeconfig), retries=0),
        watch_timeout=5,
        request_timeout=5,
        backoff=(0.05, 0.5),
    )


@pytest.fixture
def watcher(installed: Installed) -> Iterator[informer.NodeWatcher]:
    running = start(installed.webhook_kubeconfig)
    yield running
    running.stop()
    delete_nodes(installed.api, seen_by=installed.server)


def prepared(watcher: informer.NodeWatcher) -> Prepared:
    """What a worker makes of the watch's snapshot (through the file, in the server)."""
    _, status, facts = watcher.snapshot()
    return prepare(facts, status, GIB)


def sizes(watcher: informer.NodeWatcher) -> dict[str, int]:
    return {n.name: n.gpu_memory for n in prepared(watcher).nodes or ()}


def test_lists_then_follows_added_modified_and_deleted_nodes(
    installed: Installed, watcher: informer.NodeWatcher
) -> None:
    api = installed.api
    put_node(api, "a", memory=48, count=2)
    put_node(api, "cpu-only", memory=0, count=0)
    watcher.start()
    eventually(lambda: sizes(watcher) == {"a": 24})
    assert watcher.status().synced
    assert watcher.status().nodes == 2
    put_node(api, "b", memory=80, count=1, labels={"pool": "a100"})
    eventually(lambda: sizes(watcher) == {"a": 24, "b": 80})
    put_node(api, "a", memory=96, count=2)
    eventually(lambda: sizes(watcher) == {"a": 48, "b": 80})
    delete_nodes(api)
    eventually(lambda: sizes(watcher) == {})
    assert watcher.lists == 1  # every change came through the watch


def test_a_watch_from_a_compacted_revision_lists_again(
    installed: Installed, watcher: informer.NodeWatcher
) -> None:
    """etcd compacted past the watch, the API server restarted: 410 Gone, then a new list."""
    api, plane = installed.api, installed.plane
    put_node(api, "a", memory=24, count=1)
    watcher.start()
    eventually(lambda: sizes(watcher) == {"a": 24})
    put_node(api, "a", memory=32, count=1)
    eventually(lambda: sizes(watcher) == {"a": 32})
    plane.compact_etcd()
    plane.restart_apiserver()
    put_node(api, "z", memory=8, count=1)
    eventually(lambda: sizes(watcher) == {"a": 32, "z": 8}, timeout=60)
    assert watcher.lists >= 2


def test_no_gpu_node_falls_back_to_the_policy(
    installed: Installed, watcher: informer.NodeWatcher
) -> None:
    put_node(installed.api, "cpu", memory=0, count=0)
    watcher.start()
    eventually(lambda: watcher.status().synced)
    view = prepared(watcher)
    assert view.nodes is None
    assert "no node reports aliyun.com/gpu-mem" in view.note


def test_forbidden_names_the_missing_permission(installed: Installed) -> None:
    """A ServiceAccount without the manifests' node RBAC: the API server's 403, explained."""
    kubeconfig = service_account_kubeconfig(installed.plane, "default", installed.folder)
    watcher = start(kubeconfig)
    watcher.start()
    try:
        eventually(lambda: "forbidden" in watcher.status().problem)
        assert "'list' and 'watch' on nodes" in watcher.status().problem
        assert "forbidden" in prepared(watcher).note
        assert not watcher.status().connected
    finally:
        watcher.stop()


def test_limits_narrow_to_the_pool_a_pod_selects(
    installed: Installed, watcher: informer.NodeWatcher
) -> None:
    api = installed.api
    put_node(api, "t4-1", memory=16, count=1, labels={"pool": "t4"})
    put_node(api, "a100-1", memory=80, count=1, labels={"pool": "a100"})
    put_node(api, "a100-2", memory=160, count=2, labels={"pool": "a100"})
    watcher.start()
    eventually(lambda: len(sizes(watcher)) == 3)
    view = prepared(watcher)
    everywhere = view.bounds({})
    assert (everywhere.largest_gpu, everywhere.nodes_with_largest) == (80, 2)
    t4 = view.bounds({"nodeSelector": {"pool": "t4"}})
    assert (t4.largest_gpu, t4.nodes_with_largest) == (16, 1)
