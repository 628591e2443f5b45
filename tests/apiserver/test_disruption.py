"""The moments operators live through, under a steady stream of pod creates.

Against the real API server, two real replicas behind a home-made stand-in
for a Service whose endpoint list lags their readiness by ``LAG`` seconds
(tests/apiserver/disruption.py and service.py say how), with creator
threads creating GPU and other pods throughout: a rolling update, a
rotation of the serving pair, a policy edit, a guard upgrade and a replica
killed with SIGKILL. Every create is counted by the event it was sent in,
and every GPU pod stored is checked for its set-up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.apiserver.disruption import (
    Creators,
    Replicas,
    apply_guard,
    dump,
    policy_text,
    remove_guard,
    unconfined,
)
from tests.apiserver.helpers import (
    create_namespace,
    delete_namespaces,
    gpu_container,
    pod_manifest,
    wait_for_service_account,
)
from tests.apiserver.service import Service
from tests.controlplane.install import Installed, point_webhook_at, write_policy

NAMESPACE = "disruption"
LAG = 1.0  # the endpoint list's lag behind the replicas' readiness
DRAIN = LAG + 1.5  # the replicas' --drain: longer than the lag, as the default is in a cluster
RATE = 20.0  # creates a second, all creators together
SETTLE = 1.5  # seconds of steady creates after each event
# Longer than the idle timeout serve had before (30 s), shorter than the API
# server keeps an idle connection (90 s): the relation a cluster has.
IDLE_GAP = 31.0


@pytest.fixture(scope="module")
def replicas(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    folder = tmp_path_factory.mktemp("disruption")
    service = Service(installed.server.ca, lag=LAG)
    running = Replicas(installed, service, folder, drain=DRAIN)
    shipped = policy_text(installed)
    create_namespace(installed.api, NAMESPACE)
    try:
        wait_for_service_account(installed.api, NAMESPACE)
        running.start()
        running.start()
        apply_guard(installed, shipped, folder)
        point_webhook_at(installed.plane, f"https://127.0.0.1:{service.port}/mutate")
        yield running
    finally:
        point_webhook_at(installed.plane, f"https://127.0.0.1:{installed.server.port}/mutate")
        remove_guard(installed)
        write_policy(installed.plane, shipped)
        running.stop()
        service.close()
        delete_namespaces(installed.api, NAMESPACE)


def test_no_create_is_lost_to_an_update_a_rotation_a_policy_edit_or_a_guard_upgrade(
    replicas: Replicas,
) -> None:
    with Creators(replicas.installed, NAMESPACE, rate=RATE) as creators:
        time.sleep(SETTLE)
        creators.during("rolling update", replicas.rolling_update, SETTLE)
        creators.during("certificate rotation", replicas.rotate, SETTLE)
        creators.during("policy edit", replicas.edit_policy, SETTLE)
        creators.during("guard upgrade", replicas.upgrade_guard, SETTLE)
        killed = creators.during("SIGKILL", replicas.kill_one, LAG + 2.0)
        creators.during("replacement", replicas.start, SETTLE)
    summary = creators.summary()
    failed = [c for c in creators.done if c.outcome != "answered"]
    # Killed hard, a replica loses the calls in flight to it (sent in the
    # event before, some of them) and those sent to its address until the
    # endpoint list drops it; none after that, and none in any other event.
    dropped = killed + LAG + replicas.service.period + 2.0
    lost = [c for c in failed if not (killed <= c.ended and c.started <= dropped)]
    assert not lost, (lost[:3], dump([summary, creators.examples]))
    assert all(row["attempted"] >= 10 for row in summary.values()), dump(summary)
    assert not unconfined(replicas.installed, NAMESPACE)


def test_a_create_after_an_idle_gap_reuses_the_kept_connection(replicas: Replicas) -> None:
    core = client.CoreV1Api(replicas.installed.api)
    core.create_namespaced_pod(
        NAMESPACE, pod_manifest("before-the-gap", gpu_container(), labels={"gpu": "true"})
    )
    opened = sum(replicas.service.opened.values())
    time.sleep(IDLE_GAP)
    # Refused, it would raise.
    core.create_namespaced_pod(
        NAMESPACE, pod_manifest("after-the-gap", gpu_container(), labels={"gpu": "true"})
    )
    # The replica kept the connection through the gap, and the API server sent on it.
    assert sum(replicas.service.opened.values()) == opened
