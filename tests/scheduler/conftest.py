"""The scheduling tier: one cluster for the whole run with kube-scheduler, KWOK and the extender.

The control plane, KWOK and the GPU Share Scheduler Extender are built (or
found in their caches) once, after collection and before the first test,
so a cold build is not charged to any test's timeout. Without Go, or
without the extender's source (``GPUSHARE_EXTENDER_SOURCE``, see
tests/controlplane/extender.py), the tier skips with one reason line; with
CI=true a missing source or a failing build fails every test of the tier.

``cluster`` is the SchedulingPlane in whatever scheduler configuration it
was last put; ``scheduler`` is the same cluster, once per configuration
(tests using it run grouped by configuration, so kube-scheduler restarts
about once). ``installed`` is the webhook installed into it as the apiserver
tier installs it. ``namespace`` and ``gpu_node`` clean up after a test.
``pipeline`` bundles them for the tests that take pods through all of it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.apiserver.helpers import create_namespace, wait_for_service_account
from tests.conftest import stop_server
from tests.controlplane import build, extender, scheduling
from tests.controlplane.install import Installed, api_client, install
from tests.controlplane.scheduling import SchedulingPlane, put_gpu_node
from tests.helpers import eventually, unavailable
from tests.scheduler.helpers import Pipeline

_BUILT = pytest.StashKey[tuple[build.Binaries, scheduling.Programs] | str]()
_SKIPPED = pytest.StashKey[str]()
_NAMES = itertools.count(1)
LOGS = ("kube-scheduler", scheduling.EXTENDER, "kwok", "kube-apiserver", "kube-controller-manager")


def _missing() -> str | None:
    """Why the tier cannot run here, where that is a skip and not a failure (outside CI)."""
    if os.environ.get("CI") == "true":
        return None
    try:
        build.find_go()
        extender.source()
    except build.Unavailable as error:
        return str(error)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(str(item.path)).parents]
    missing = _missing() if ours else None
    if missing:
        # One line for the whole tier (pytest_terminal_summary), not one per test.
        config.stash[_SKIPPED] = f"scheduling tier skipped ({len(ours)} tests): {missing}"
        config.hook.pytest_deselected(items=ours)
        items[:] = [item for item in items if item not in ours]
        return
    for item in ours:
        item.add_marker(pytest.mark.scheduler)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _SKIPPED in config.stash:
        terminalreporter.write_line(config.stash[_SKIPPED], yellow=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("scheduler") for item in session.items):
        return
    try:
        session.config.stash[_BUILT] = (build.ensure(), scheduling.ensure())
    except build.Unavailable as error:
        session.config.stash[_BUILT] = str(error)


@pytest.fixture(scope="session")
def built(pytestconfig: pytest.Config) -> tuple[build.Binaries, scheduling.Programs]:
    found = pytestconfig.stash.get(_BUILT, "the build did not run")
    if isinstance(found, str):
        unavailable("scheduling tier", found)
    return found


@pytest.fixture(scope="session")
def cluster(
    built: tuple[build.Binaries, scheduling.Programs], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SchedulingPlane]:
    binaries, programs = built
    with scheduling.running(tmp_path_factory.mktemp("scheduling"), binaries, programs) as plane:
        yield plane


@pytest.fixture(scope="session", params=scheduling.CONFIGURATIONS)
def configuration(request: pytest.FixtureRequest) -> str:
    """A scheduler configuration (of scheduling.CONFIGURATIONS); session-scoped so the tests
    run grouped by it. ``@pytest.mark.parametrize("configuration", ["profiles"])`` picks one."""
    return str(request.param)


@pytest.fixture
def scheduler(cluster: SchedulingPlane, configuration: str) -> SchedulingPlane:
    """The cluster with kube-scheduler in ``configuration`` (restarted only when it changes)."""
    cluster.use(configuration)
    return cluster


@pytest.fixture(scope="session")
def api(cluster: SchedulingPlane) -> client.ApiClient:
    """A client of the cluster's API server as the admin."""
    return api_client(cluster.kubeconfig)


@pytest.fixture(scope="session")
def installed(
    cluster: SchedulingPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """The webhook installed with the shipped policy (``installed.set_policy`` changes it)."""
    done = install(cluster, tmp_path_factory.mktemp("installed"))
    try:
        yield done
    finally:
        stop_server(done.server)


@pytest.fixture
def namespace(api: client.ApiClient, gpu_node: Any) -> Iterator[str]:
    """A new namespace for the test; its pods deleted at once afterwards, then it (before the
    nodes of ``gpu_node`` go, so no pod is left on a deleted node)."""
    name = f"sched-{next(_NAMES)}-{int(time.time()) % 100000}"
    create_namespace(api, name)
    wait_for_service_account(api, name)
    yield name
    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    eventually(lambda: not core.list_namespaced_pod(name).items, timeout=30)
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


@pytest.fixture
def gpu_node(api: client.ApiClient) -> Iterator[Callable[..., dict[str, Any]]]:
    """``gpu_node(name, gpus=4, memory=16, labels=None, gpu_count=True, ...)``: a fake GPU node
    (tests.controlplane.scheduling.put_gpu_node), deleted after the test."""
    made: list[str] = []

    def make(name: str, **options: Any) -> dict[str, Any]:
        made.append(name)
        return put_gpu_node(api, name, **options)

    yield make
    core = client.CoreV1Api(api)
    for name in made:
        with contextlib.suppress(ApiException):
            core.delete_node(name)


@pytest.fixture
def pipeline(
    installed: Installed,
    scheduler: SchedulingPlane,
    api: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., dict[str, Any]],
) -> Pipeline:
    """The webhook installed into the cluster with kube-scheduler in ``configuration``, a
    namespace and fake GPU nodes of the test's own: tests.scheduler.helpers.Pipeline."""
    return Pipeline(installed, scheduler, api, namespace, gpu_node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and "cluster" in getattr(item, "fixturenames", ()):
        plane: SchedulingPlane | None = item.funcargs.get("cluster")  # type: ignore[attr-defined]
        if plane is not None:
            for name in LOGS:
                report.sections.append((f"{name} log (tail)", plane.log_tail(name, 40)))
            report.sections.append(("cluster files", str(plane.root)))
    return report
