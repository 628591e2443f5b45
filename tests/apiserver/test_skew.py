"""Version skew: every pod an earlier release set up passes the guard this code makes.

During an upgrade the old webhook's replicas answer beside the new ones and
the new guard is applied at some moment in between, so the guard of
release N must pass the set-up of release N-1 (docs/operations.md,
"Version skew"). The pods are the kept set of tests/skew, one folder per
release; each is created (dry run) through the real API server with the
webhook's configuration edited to call it for no create, so the guard alone
judges the set-up the earlier release gave it. And the other way: what this
code sets up passes the guard each earlier release made, kept with its pods.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

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
from tests.controlplane.install import Installed, webhook_cli
from tests.helpers import eventually
from tests.skew import CASES, NAMESPACE, POLICIES, guards, kept

SKEW = Path(__file__).parents[1] / "skew"
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


def _guarded_by(installed: Installed, guard: list[dict[str, Any]]) -> None:
    """The guard ``guard`` alone in force: none first, then this one."""
    _remove(installed)
    eventually(lambda: _dry_run(installed.api, NAMESPACE, BARE) is None, timeout=30)
    _apply(installed, guard)
    eventually(lambda: GUARDED in (_dry_run(installed.api, NAMESPACE, BARE) or ""), timeout=30)


def test_every_kept_set_up_passes_the_guard_of_its_policy(unhooked: Installed) -> None:
    pods = kept()
    assert {release for release, _, _ in pods} >= {"0.1.0"}
    for (release, policy), group in groupby(pods, key=lambda kept_pod: kept_pod[:2]):
        _guarded_by(unhooked, _made(SKEW / release / f"{policy}.policy.yaml"))
        for _, _, path in group:
            body = yaml.safe_load(path.read_text())
            message = _dry_run(unhooked.api, NAMESPACE, body)
            assert message is None, f"{path}: the guard of this release refuses it: {message}"


def test_what_this_code_sets_up_passes_every_kept_guard(unhooked: Installed) -> None:
    """The other direction: the guard of an earlier release, still in force while the new
    webhook answers, passes the new set-up."""
    found = guards()
    assert found, "no kept guard"
    for guard in found:
        release, policy = guard.parent.name, guard.name.removesuffix(".guard.yaml")
        _guarded_by(unhooked, [doc for doc in yaml.safe_load_all(guard.read_text()) if doc])
        for case in POLICIES[policy][1]:
            made = webhook_cli(
                "mutate",
                str(_written(unhooked, case)),
                "--policy",
                str(SKEW / release / f"{policy}.policy.yaml"),
            )
            assert made.returncode == 0, made.stderr
            message = _dry_run(unhooked.api, NAMESPACE, yaml.safe_load(made.stdout))
            assert message is None, f"{case}: the guard of {release} refuses it: {message}"


def _written(installed: Installed, case: str) -> Path:
    path = installed.folder / f"skew-{case}.yaml"
    path.write_text(yaml.safe_dump(CASES[case]))
    return path
