"""Version skew: every pod an earlier release set up passes the guard this code makes.

During an upgrade the old webhook's replicas answer beside the new ones and
the new guard is applied at some moment in between, so the guard of
release N must pass the set-up of release N-1 (docs/operations.md,
"Version skew"). The pods are the kept set of tests/skew, one folder per
release; each is created (dry run) through the real API server with the
webhook's configuration edited to call it for no create, so the guard alone
judges the set-up the earlier release gave it.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from pathlib import Path

import pytest
import yaml

from tests.apiserver.helpers import (
    create_namespace,
    delete_namespaces,
    gpu_container,
    pod_manifest,
    wait_for_service_account,
)
from tests.apiserver.test_guard import (
    GUARDED,
    _apply,
    _dry_run,
    _made,
    _remove,
    configuration_edited,
)
from tests.controlplane.install import Installed
from tests.helpers import eventually
from tests.skew import NAMESPACE, kept

BARE = pod_manifest("bare", gpu_container())  # a GPU pod with no set-up at all


@pytest.fixture(scope="module")
def unhooked(installed: Installed) -> Iterator[Installed]:
    """The namespace the kept pods name, and the webhook called for no create."""
    create_namespace(installed.api, NAMESPACE)
    try:
        wait_for_service_account(installed.api, NAMESPACE)
        with configuration_edited(installed):
            yield installed
    finally:
        _remove(installed)
        delete_namespaces(installed.api, NAMESPACE)


def _guarded_by(installed: Installed, policy: Path) -> None:
    """The guard made from ``policy`` alone in force: none first, then this one."""
    _remove(installed)
    eventually(lambda: _dry_run(installed.api, NAMESPACE, BARE) is None, timeout=30)
    _apply(installed, _made(policy))
    eventually(lambda: GUARDED in (_dry_run(installed.api, NAMESPACE, BARE) or ""), timeout=30)


def test_every_kept_set_up_passes_the_guard_of_its_policy(unhooked: Installed) -> None:
    pods = kept()
    assert {release for release, _, _ in pods} >= {"0.1.0"}
    for (release, policy), group in groupby(pods, key=lambda kept_pod: kept_pod[:2]):
        _guarded_by(
            unhooked, Path(__file__).parents[1] / "skew" / release / f"{policy}.policy.yaml"
        )
        for _, _, path in group:
            body = yaml.safe_load(path.read_text())
            message = _dry_run(unhooked.api, NAMESPACE, body)
            assert message is None, f"{path}: the guard of this release refuses it: {message}"
