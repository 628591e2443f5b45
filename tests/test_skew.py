"""The kept set-up of each release (tests/skew): this release has its own, whole."""

from __future__ import annotations

import yaml

from tests.skew import CASES, POLICIES, kept
from webhook import __version__
from webhook.decision.policy import parse_policy_text


def test_this_release_keeps_its_set_up_of_every_case() -> None:
    # A new version without its folder: python -m tests.skew makes it.
    found = {(policy, path.stem) for _, policy, path in kept(__version__)}
    wanted = {(policy, case) for policy, (_, cases) in POLICIES.items() for case in cases}
    assert found == wanted, "run python -m tests.skew for this release"
    assert set().union(*(cases for _, cases in POLICIES.values())) == set(CASES)


def test_every_kept_pod_is_set_up_and_its_policy_parses() -> None:
    for release, policy, path in kept():
        parse_policy_text((path.parents[1] / f"{policy}.policy.yaml").read_text(), source=policy)
        pod = yaml.safe_load(path.read_text())
        assert "gpushare-webhook.io/status" in pod["metadata"]["annotations"], (release, path)
