"""The node watch's ``scheduler: dra`` side, in pieces: what a pod names, what a class maps,
the policy it reads, the counts it shares, and a cluster without resource.k8s.io/v1.

The real API server's side (ResourceSlices sizing pods, a mapping
DeviceClass, a template made for a pending pod) is in
tests/apiserver/test_dra_watch.py. An API server that lacks
resource.k8s.io/v1 altogether is the stand-in here (tests/kubeapi.py), which
answers 404 for every path it does not serve, as an older kube-apiserver does.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually
from tests.kubeapi import serve
from webhook.cluster import informer, kube
from webhook.cluster.templates import TemplateMaker, wanted
from webhook.cluster.watches import Watches, mapped_classes
from webhook.cluster.watchprocess import PolicyFile
from webhook.decision import DEFAULT_POLICY, DraFacts, decode_snapshot, encode_snapshot
from webhook.decision.nodesource import NodeStatus
from webhook.decision.policy import parse_policy_text
from webhook.serving.nodefile import SharedNodes

T = "gpushare-4096mi.gpu.nvidia.com"


def pending(namespace: str | None, *claims: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": "p"} | ({"namespace": namespace} if namespace else {})
    return {"metadata": meta, "spec": {"resourceClaims": list(claims)}}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (pending("a", {"name": "gpushare-main", "resourceClaimTemplateName": T}), [f"a/{T}"]),
        (
            pending(
                "a",
                {"name": "gpushare-main", "resourceClaimTemplateName": T},
                {"name": "gpushare-side", "resourceClaimTemplateName": T},
                {"name": "gpushare-warm", "resourceClaimTemplateName": "gpushare-2048mi-x2.g"},
            ),
            [f"a/{T}", "a/gpushare-2048mi-x2.g"],
        ),
        (pending("a", {"name": "nic", "resourceClaimTemplateName": "rdma"}), []),
        (pending("a", {"name": "gpushare-main", "resourceClaimName": "made-by-hand"}), []),
        (pending(None, {"name": "gpushare-main", "resourceClaimTemplateName": T}), []),
        (pending("a", "not a claim"), []),  # type: ignore[arg-type]
        ({"metadata": {"namespace": "a"}}, []),
        ({}, []),
    ],
    ids=[
        "one-claim",
        "one-template-named-twice-and-another",
        "not-ours",
        "a-claim-not-a-template",
        "no-namespace",
        "not-a-mapping",
        "no-spec",
        "nothing",
    ],
)
def test_the_templates_a_pending_pod_names(pod: dict[str, Any], expected: list[str]) -> None:
    assert wanted(pod) == expected


@pytest.mark.parametrize(
    ("obj", "key"),
    [
        ({"metadata": {"name": "n1"}}, "n1"),
        ({"metadata": {"name": "p", "namespace": "team"}}, "team/p"),
        ({}, ""),
    ],
    ids=["cluster-scoped", "namespaced", "nameless"],
)
def test_where_a_watch_keeps_an_object(obj: dict[str, Any], key: str) -> None:
    assert informer.key_of(obj) == key


@pytest.mark.parametrize(
    ("classes", "policy", "expected"),
    [
        ((("gpu.nvidia.com", "nvidia.com/gpu"),), "{}", ()),
        ((("mem", "aliyun.com/gpu-mem"),), "{}", ("mem (aliyun.com/gpu-mem)",)),
        ((("count", "aliyun.com/gpu-count"),), "{}", ("count (aliyun.com/gpu-count)",)),
        ((("mem", "aliyun.com/gpu-mem"),), "scheduler: dra", ("mem (aliyun.com/gpu-mem)",)),
        (
            (("b", "aliyun.com/gpu-mem"), ("a", "aliyun.com/gpu-core.percentage")),
            "{}",
            ("a (aliyun.com/gpu-core.percentage)", "b (aliyun.com/gpu-mem)"),
        ),
        ((), "{}", ()),
    ],
    ids=["other-resource", "memory", "count", "under-dra", "two-sorted", "none"],
)
def test_the_device_classes_that_map_the_policys_resources(
    classes: tuple[tuple[str, str], ...], policy: str, expected: tuple[str, ...]
) -> None:
    assert mapped_classes(classes, parse_policy_text(policy)) == expected


def test_the_policy_file_is_read_again_when_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("scheduler: dra\n")
    policy = PolicyFile(path, interval=0)
    assert policy.get().placed_by.claims
    path.write_text("dra: {memoryCapacity: mem}\nscheduler: dra\n")
    policy.refresh()
    assert policy.get().dra.memory_capacity == "mem"
    path.write_text("scheduler: [broken\n")
    policy.refresh()
    policy.refresh()
    assert policy.get().dra.memory_capacity == "mem"  # the last good one
    assert len([r for r in caplog.records if "keep the last good policy" in r.message]) == 1
    assert PolicyFile(None).get() is DEFAULT_POLICY


def test_the_workers_read_the_dra_facts_and_the_template_counts(tmp_path: Path) -> None:
    snapshot, counts = tmp_path / "nodes.json", tmp_path / "templates.json"
    dra = DraFacts(classes=(("mem", "aliyun.com/gpu-mem"),))
    snapshot.write_bytes(encode_snapshot(NodeStatus(watching=True, synced=True), (), dra))
    shared = SharedNodes(snapshot, templates=counts, interval=0)
    assert shared.prepared(DEFAULT_POLICY).mapped == (("mem", "aliyun.com/gpu-mem"),)
    assert decode_snapshot(snapshot.read_bytes())[2] == dra
    assert shared.templates() == {"created": 0, "failures": 0}  # not written yet
    counts.write_text(json.dumps({"created": 3, "failures": 1}))
    assert shared.templates() == {"created": 3, "failures": 1}
    counts.write_text("[")
    assert shared.templates() == {"created": 0, "failures": 0}


def test_without_resource_k8s_io_the_nodes_go_on_and_it_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with serve(tmp_path) as (api, kubeconfig):
        api.put_node("a", memory=24, count=1)
        watches = Watches(
            lambda: kube.api_client(str(kubeconfig), retries=0),
            "",
            lambda: DEFAULT_POLICY,
            backoff=(0.01, 0.05),
        )
        watches.start()
        try:
            eventually(watches.ready)
            eventually(lambda: watches.slices.lists == 0 and len(api.requests) > 20)
            time.sleep(0.2)  # several more looks at each absent kind
            status, facts, dra = watches.snapshot()
            assert [f.name for f in facts] == ["a"]
            assert status.synced
            assert dra == DraFacts()
        finally:
            watches.stop(timeout=2)
    said = [r.getMessage() for r in caplog.records if "going on without them" in r.getMessage()]
    assert sorted(line.split(" watch:")[0] for line in said) == [
        "DeviceClass",
        "ResourceSlice",
        "claim template",
        "dra pod",
    ]
    assert "does not serve /apis/resource.k8s.io/v1/resourceslices" in "".join(said)
    assert not [r for r in caplog.records if r.exc_info]


def test_a_refused_create_is_tried_again_while_its_pod_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stand-in serves no resource.k8s.io, so every create is refused (404)."""
    waiting = pending("team", {"name": "gpushare-main", "resourceClaimTemplateName": T})
    with serve(tmp_path) as (api, kubeconfig):
        maker = TemplateMaker(
            lambda: kube.api_client(str(kubeconfig), retries=0),
            lambda: DEFAULT_POLICY,
            lambda key: False,
            retry_after=0.1,
        )
        maker.pod("ADDED", waiting)
        maker.pod("MODIFIED", waiting)  # too soon after the failure
        maker.retry(lambda key: True)  # too soon too
        assert maker.failures == 1
        time.sleep(0.15)
        maker.retry(lambda key: key == "team/p")
        assert maker.failures == 2
        time.sleep(0.15)
        maker.retry(lambda key: False)  # the pod was bound or deleted: nothing waits
        time.sleep(0.15)
        maker.retry(lambda key: True)
        assert maker.failures == 2
        assert maker.created == 0
        posts = [path for verb, path in api.requests if verb == "post"]
        assert posts == ["/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates"] * 2
    said = [r.getMessage() for r in caplog.records if "not made" in r.getMessage()]
    assert len(said) == 2
    assert said[0].startswith(f"claim template {T} not made in namespace team (pod p waits for it)")
    assert "HTTP 404" in said[0]
