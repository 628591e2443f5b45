"""The real-control-plane tier: one cluster for the whole run, the webhook installed into it.

The binaries are built (or found in the cache) once, after collection and
before the first test, so a cold build is not charged to any test's
timeout. Without Go the tier skips with one reason line; with CI=true a
missing or failing build fails every test of the tier instead.

``installed`` is the webhook installed from the manifests and served
(tests/controlplane/install.py says how).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver.helpers import shared_objects
from tests.conftest import stop_server
from tests.controlplane import build
from tests.controlplane.cluster import ControlPlane, running
from tests.controlplane.install import Installed, install
from tests.helpers import unavailable

_BINARIES = pytest.StashKey[build.Binaries | str]()
_SKIPPED = pytest.StashKey[str]()


def _missing_go() -> str | None:
    """Why the tier cannot run here, where that is a skip and not a failure (outside CI)."""
    if os.environ.get("CI") == "true":
        return None
    try:
        build.find_go()
    except build.Unavailable as error:
        return str(error)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(str(item.path)).parents]
    missing = _missing_go() if ours else None
    if missing:
        # One line for the whole tier (pytest_terminal_summary), not one per test.
        config.stash[_SKIPPED] = f"real control plane tier skipped ({len(ours)} tests): {missing}"
        config.hook.pytest_deselected(items=ours)
        items[:] = [item for item in items if item not in ours]
        return
    for item in ours:
        item.add_marker(pytest.mark.apiserver)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _SKIPPED in config.stash:
        terminalreporter.write_line(config.stash[_SKIPPED], yellow=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("apiserver") for item in session.items):
        return
    try:
        session.config.stash[_BINARIES] = build.ensure()
    except build.Unavailable as error:
        session.config.stash[_BINARIES] = str(error)


@pytest.fixture(scope="session")
def binaries(pytestconfig: pytest.Config) -> build.Binaries:
    found = pytestconfig.stash.get(_BINARIES, "the build did not run")
    if isinstance(found, str):
        unavailable("real control plane", found)
    return found


@pytest.fixture(scope="session")
def plane(
    binaries: build.Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    with running(tmp_path_factory.mktemp("control-plane"), binaries) as started:
        yield started


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and "plane" in getattr(item, "fixturenames", ()):
        plane: ControlPlane | None = item.funcargs.get("plane")  # type: ignore[attr-defined]
        if plane is not None:
            for name in ("kube-apiserver", "kube-controller-manager", "etcd"):
                report.sections.append((f"{name} log (tail)", plane.log_tail(name, 40)))
            report.sections.append(("control plane files", str(plane.root)))
    return report


@pytest.fixture(scope="session")
def installed(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The webhook installed and served; at the end, a check that no test left anything behind.

    Every test shares this control plane, in any order: a node, namespace or
    webhook configuration a test leaves changes what the next one sees.
    """
    done = install(plane, tmp_path_factory.mktemp("installed"))
    before = shared_objects(done.api)
    try:
        yield done
    finally:
        stop_server(done.server)
    left = sorted(shared_objects(done.api) - before)
    assert not left, f"tests left these in the shared control plane: {', '.join(left)}"
