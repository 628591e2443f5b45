"""The kept set-up of each release (tests/skew): this release has its own, whole."""

from __future__ import annotations

import yaml

from tests.skew import CASES, POLICIES, guards, kept
from webhook import __version__
from webhook.decision.policy import parse_policy_text
from webhook.decision.prepared import Prepared
from webhook.report.findings import judge_pod


def test_this_release_keeps_its_set_up_of_every_case() -> None:
    # A new version without its folder: python -m tests.skew makes it.
    found = {(policy, path.stem) for _, policy, path in kept(__version__)}
    wanted = {(policy, case) for policy, (_, cases) in POLICIES.items() for case in cases}
    assert found == wanted, "run python -m tests.skew for this release"
    assert {path.name for path in guards(__version__)} == {f"{p}.guard.yaml" for p in POLICIES}
    assert set().union(*(cases for _, cases in POLICIES.values())) == set(CASES)


def test_every_kept_pod_is_set_up_and_its_policy_parses() -> None:
    for release, policy, path in kept():
        parse_policy_text((path.parents[1] / f"{policy}.policy.yaml").read_text(), source=policy)
        pod = yaml.safe_load(path.read_text())
        assert "gpushare-webhook.io/status" in pod["metadata"]["annotations"], (release, path)


def test_report_calls_every_kept_set_up_confined() -> None:
    """A pod set up by an earlier release, as tightly confined as now, is not drifted."""
    for _, policy, path in kept():
        rules = parse_policy_text((path.parents[1] / f"{policy}.policy.yaml").read_text())
        found = judge_pod(yaml.safe_load(path.read_text()), Prepared(rules))
        assert found is not None
        assert found.status == "confined", (path, found)
