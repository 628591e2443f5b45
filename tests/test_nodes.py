"""GPU sizes from the cluster: the node watch under faults, and the workers' snapshot.

The watch's ordinary life (list, adds, changes, deletes, 410 after a
compaction, RBAC, node pools) is tested against the real API server in
tests/apiserver/test_node_watcher.py. Here the real ``kubernetes`` client
talks HTTP to tests/kubeapi.py for what only a stand-in does on demand:
a stream cut after a given number of events, HTTP 500s, and answers
delayed by a set time.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.kubeapi import FakeApi, serve
from tests.test_capacity import FACTS
from webhook.cluster import informer, kube
from webhook.decision.capacity import NodeFacts
from webhook.decision.nodesource import NodeStatus, encode_snapshot, prepare
from webhook.decision.policy import DEFAULT_POLICY
from webhook.decision.prepared import Prepared
from webhook.serving.nodefile import SharedNodes

GIB = DEFAULT_POLICY


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeApi, Path]]:
    with serve(tmp_path) as (api, kubeconfig):
        yield api, kubeconfig


@pytest.fixture
def watcher(cluster: tuple[FakeApi, Path]) -> Iterator[informer.NodeWatcher]:
    _, kubeconfig = cluster
    running = informer.NodeWatcher(
        lambda: kube.api_client(str(kubeconfig), retries=0),
        watch_timeout=2,
        request_timeout=2,
        backoff=(0.05, 0.2),
    )
    yield running
    running.stop()


def start_with_one_node(api: FakeApi, watcher: informer.NodeWatcher) -> None:
    """Node "a" with one 24 GiB GPU, listed by a started watcher."""
    api.put_node("a", memory=24, count=1)
    watcher.start()
    eventually(lambda: sizes(watcher) == {"a": 24})


def prepared(watcher: informer.NodeWatcher) -> Prepared:
    """What a worker makes of the watch's snapshot (through the file, in the server)."""
    _, status, facts = watcher.snapshot()
    return prepare(facts, status, DEFAULT_POLICY)


def sizes(watcher: informer.NodeWatcher) -> dict[str, int]:
    return {n.name: n.gpu_memory for n in prepared(watcher).nodes or ()}


def test_a_broken_watch_resumes_without_a_new_list(
    cluster: tuple[FakeApi, Path], watcher: informer.NodeWatcher
) -> None:
    api, _ = cluster
    start_with_one_node(api, watcher)
    api.break_watch_after = 1  # the stream is cut after one more event
    api.put_node("b", memory=40, count=1)
    api.put_node("c", memory=80, count=1)
    eventually(lambda: sizes(watcher) == {"a": 24, "b": 40, "c": 80})
    assert watcher.lists == 1
    assert watcher.watches >= 2


def test_unreachable_api_falls_back_to_the_policy_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with serve(tmp_path) as (_, path):
        kubeconfig.write_text(path.read_text())
    # The server is gone now: nothing listens on its port.
    watcher = informer.NodeWatcher(
        lambda: kube.api_client(str(kubeconfig), retries=0),
        request_timeout=1,
        backoff=(0.05, 0.1),
    )
    caplog.set_level(logging.INFO)
    watcher.start()
    try:
        eventually(lambda: "cannot reach the Kubernetes API" in watcher.status().problem)
        eventually(lambda: len(caplog.records) >= 3)
        # One line per step of the backoff, from the watch alone: no client retries.
        for record in caplog.records:
            assert record.name == "gpushare_webhook.nodes", record.getMessage()
            assert re.fullmatch(
                r"node watch: cannot reach the Kubernetes API at https?://127\.0\.0\.1:\d+ "
                r"\(\[Errno 111\] Connection refused\); trying again in [\d.e-]+ s",
                record.getMessage(),
            ), record.getMessage()
        view = prepared(watcher)
        assert view.nodes is None
        assert view.note.startswith("GPU sizes come from the policy's gpuMemory (16 GiB)")
        assert "node list is not available" in view.note
        assert not watcher.status().synced
        assert not watcher.status().connected
    finally:
        watcher.stop()


def test_errors_keep_the_last_known_nodes_then_recover(
    cluster: tuple[FakeApi, Path], watcher: informer.NodeWatcher
) -> None:
    api, _ = cluster
    start_with_one_node(api, watcher)
    api.fail_next = 1000
    api.break_watch_after = 0
    api.put_node("b", memory=40, count=1)
    eventually(lambda: "HTTP 500" in watcher.status().problem)
    assert not watcher.status().connected
    assert sizes(watcher) == {"a": 24}  # last good state, not the policy
    assert prepared(watcher).note == ""
    api.fail_next = 0
    eventually(lambda: sizes(watcher) == {"a": 24, "b": 40})
    eventually(lambda: watcher.status().connected and not watcher.status().problem)


def test_a_slow_api_does_not_block_reviews(
    cluster: tuple[FakeApi, Path], watcher: informer.NodeWatcher
) -> None:
    api, _ = cluster
    api.put_node("a", memory=24, count=1)
    api.delay = 1.0
    watcher.request_timeout = 0.3  # the API answers slower than the watch waits
    watcher.start()
    started = time.monotonic()
    view = prepared(watcher)  # answered at once, from what is known
    assert time.monotonic() - started < 0.1
    assert view.nodes is None
    eventually(lambda: "cannot reach" in watcher.status().problem)
    api.delay = 0
    eventually(lambda: sizes(watcher) == {"a": 24})


def write_snapshot(path: Path, status: NodeStatus, facts: tuple[NodeFacts, ...] = ()) -> None:
    """As the watch does: a new file renamed over the old one."""
    partial = path.with_name("partial")
    partial.write_bytes(encode_snapshot(status, facts))
    partial.replace(path)


def test_workers_follow_the_snapshot_and_keep_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    write_snapshot(path, NodeStatus(watching=True, problem="node list not read yet"))
    shared = SharedNodes(path, interval=0)
    assert shared.prepared(DEFAULT_POLICY).nodes is None
    assert "node list not read yet" in shared.prepared(DEFAULT_POLICY).note
    synced = NodeStatus(watching=True, tried=True, synced=True, connected=True, nodes=2)
    write_snapshot(path, synced, FACTS)
    view = shared.prepared(DEFAULT_POLICY)
    assert [(n.name, n.gpu_memory) for n in view.nodes or ()] == [("a100-1", 80)]
    assert shared.prepared(DEFAULT_POLICY) is view  # one view per snapshot and policy
    path.with_name("partial").write_bytes(b"{")  # a broken file: the last good one stays
    path.with_name("partial").replace(path)
    assert shared.prepared(DEFAULT_POLICY) is view
    assert shared.status() == synced


def test_a_stopped_watch_is_reported_and_fails_liveness(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    write_snapshot(path, NodeStatus(watching=True, tried=True, synced=True, connected=True))
    alive = [True]
    shared = SharedNodes(path, alive=lambda: alive[0], interval=0)
    assert shared.liveness() == (True, "ok")
    alive[0] = False
    assert shared.liveness() == (False, "the node watch process has stopped; restart the server")
    status = shared.status()
    assert not status.connected
    assert status.problem.startswith("the node watch process has stopped")
    assert status.synced  # what it knew stays in force
