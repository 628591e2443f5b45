"""The decision, rule by rule, on pods built in code (the goldens cover whole reviews)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import GPU, apply, container, env_of, pod
from webhook.decision.capacity import GpuNode, bounds_over
from webhook.decision.plan import (
    STATUS_ANNOTATION,
    WOULD_REFUSE,
    Decision,
    is_gpu_pod,
    plan,
    plan_ephemeral,
)
from webhook.decision.policy import DEFAULT_POLICY, parse_policy, parse_policy_text
from webhook.decision.prepared import Prepared


def decide(obj: Any, **kwargs: Any) -> Decision:
    return plan(obj, Prepared(DEFAULT_POLICY), namespace="team-a", **kwargs)


def mutated(obj: Any) -> Any:
    decision = decide(obj)
    assert decision.allowed, decision.message
    return apply(obj, list(decision.patch))


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (pod(container(gpu="1")), True),
        (pod(container("web")), False),
        (pod(container("web"), init=[container("i", gpu="1")]), True),
        (pod(container(resources={"requests": {GPU: "1"}})), True),
        (pod(container(resources={"limits": {"nvidia.com/gpu": "1"}})), False),
        ({"spec": "oops"}, False),
        ({"spec": {"containers": [None, {"resources": "x"}]}}, False),
    ],
    ids=["limit", "none", "init", "request-only", "other-resource", "bad-spec", "bad-containers"],
)
def test_is_gpu_pod(obj: Any, expected: bool) -> None:
    assert is_gpu_pod(obj, DEFAULT_POLICY) is expected


PRELOADS = [
    (None, "/usr/local/vgpu/libvgpu.so"),
    ("", "/usr/local/vgpu/libvgpu.so"),
    ("/opt/a.so", "/usr/local/vgpu/libvgpu.so:/opt/a.so"),
    ("/opt/a.so /opt/b.so", "/usr/local/vgpu/libvgpu.so:/opt/a.so:/opt/b.so"),
    ("/opt/a.so:/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so:/opt/a.so"),
    ("/usr/local/vgpu/libvgpu.so:/opt/a.so", "/usr/local/vgpu/libvgpu.so:/opt/a.so"),
]


@pytest.mark.parametrize(("user", "expected"), PRELOADS, ids=[str(p[0]) for p in PRELOADS])
def test_shim_is_preloaded_first(user: str | None, expected: str) -> None:
    env = [] if user is None else [{"name": "LD_PRELOAD", "value": user}]
    out = mutated(pod(container(gpu="2", env=env)))
    assert env_of(out["spec"]["containers"][0])["LD_PRELOAD"] == expected
    assert env_of(out["spec"]["containers"][0])["CUDA_DEVICE_MEMORY_LIMIT"] == "2048m"


def test_last_preload_entry_wins_like_the_kubelet() -> None:
    env = [{"name": "LD_PRELOAD", "value": "/a.so"}, {"name": "LD_PRELOAD", "value": "/b.so"}]
    out = mutated(pod(container(gpu="1", env=env)))
    entries = [e for e in out["spec"]["containers"][0]["env"] if e["name"] == "LD_PRELOAD"]
    assert entries == [{"name": "LD_PRELOAD", "value": "/usr/local/vgpu/libvgpu.so:/b.so"}]


LIMIT = {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1024m"}
LIMIT_0 = {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1024m"}
REGION = {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/var/run/gpushare/main.cache"}
REDIRECT = {"name": "CUDA_REDIRECT", "value": "/usr/local/vgpu/libvgpu.so"}
PINNED = [LIMIT, LIMIT_0, REGION, REDIRECT]
SHIM = {"name": "LD_PRELOAD", "value": "/usr/local/vgpu/libvgpu.so"}
ENV = "/spec/containers/0/env"


def whole(op: str, *entries: dict[str, str]) -> list[dict[str, Any]]:
    return [{"op": op, "path": ENV, "value": list(entries)}]


ENV_OPS = [
    (None, whole("add", *PINNED, SHIM)),
    ([], whole("replace", *PINNED, SHIM)),
    ([{"name": "A", "value": "1"}, SHIM, *PINNED], []),
    (
        [{"name": "A", "value": "1"}, {"name": "LD_PRELOAD", "value": "/a.so"}],
        whole(
            "replace",
            {"name": "A", "value": "1"},
            {**SHIM, "value": SHIM["value"] + ":/a.so"},
            *PINNED,
        ),
    ),
    (
        [
            {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "9m"},
            {**LIMIT, "value": "9m"},
            SHIM,
            LIMIT,
            {"name": "B", "value": "2"},
            {"name": "CUDA_DEVICE_SM_LIMIT_1", "value": "9"},
        ],
        whole("replace", LIMIT_0, LIMIT, SHIM, {"name": "B", "value": "2"}, REGION, REDIRECT),
    ),
]


@pytest.mark.parametrize(
    ("env", "ops"),
    ENV_OPS,
    ids=["no-env", "empty-env", "already-set", "user-preload", "duplicates-and-overrides"],
)
def test_env_is_set_whole_in_one_op_where_it_changes(env: Any, ops: list[Any]) -> None:
    # The env as it must be, in one op: the user's entries keep their places
    # and values, the first of each pinned name is set where it is, later
    # duplicates and overriding per-device variants go, the rest is appended.
    obj = pod(
        container(gpu="1", volumeMounts=[])
        if env is None
        else container(gpu="1", env=env, volumeMounts=[])
    )
    patch = list(decide(obj).patch)
    assert [op for op in patch if op["path"].startswith(ENV)] == ops
    out = apply(obj, patch)
    assert not [op for op in decide(out).patch if op["path"].startswith(ENV)]
    mine = [e for e in env or [] if e["name"] in ("A", "B")]
    assert [e for e in out["spec"]["containers"][0]["env"] if e["name"] in ("A", "B")] == mine


def test_each_container_gets_its_own_limit_and_others_are_untouched() -> None:
    obj = pod(container("a", gpu="3"), container("web"), container("b", gpu="5"))
    out = mutated(obj)
    assert env_of(out["spec"]["containers"][0])["CUDA_DEVICE_MEMORY_LIMIT"] == "3072m"
    assert env_of(out["spec"]["containers"][2])["CUDA_DEVICE_MEMORY_LIMIT"] == "5120m"
    assert out["spec"]["containers"][1] == obj["spec"]["containers"][1]
    for index in (0, 2):
        mounts = out["spec"]["containers"][index]["volumeMounts"]
        assert {"name": "gpushare-shim", "mountPath": "/usr/local/vgpu", "readOnly": True} in mounts
    assert out["spec"]["schedulerName"] == "default-scheduler"
    assert STATUS_ANNOTATION in out["metadata"]["annotations"]


def test_limit_from_value_from_is_overridden_with_a_warning() -> None:
    env = [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    decision = decide(pod(container(gpu="1", env=env)))
    assert decision.allowed
    assert any("(valueFrom)" in w for w in decision.warnings)
    out = apply(pod(container(gpu="1", env=env)), list(decision.patch))
    assert out["spec"]["containers"][0]["env"][0] == {
        "name": "CUDA_DEVICE_MEMORY_LIMIT",
        "value": "1024m",
    }


def test_shim_mount_that_is_writable_is_made_read_only() -> None:
    mounts = [{"name": "gpushare-shim", "mountPath": "/usr/local/vgpu", "readOnly": False}]
    out = mutated(
        pod(
            container(gpu="1", volumeMounts=mounts),
            volumes=[
                {
                    "name": "gpushare-shim",
                    "hostPath": {"path": "/usr/local/vgpu", "type": "Directory"},
                }
            ],
        )
    )
    assert out["spec"]["containers"][0]["volumeMounts"][0] == {**mounts[0], "readOnly": True}


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (
            pod(
                container(
                    gpu="1",
                    volumeMounts=[
                        {"name": "x", "mountPath": "/usr/local/vgpu/libvgpu.so", "subPath": "f"}
                    ],
                )
            ),
            "shim-mount",
        ),
        (
            pod(container(gpu="1", volumeMounts=[{"name": "gpushare-shim", "mountPath": "/rw"}])),
            "shim-mount",
        ),
        (
            pod(container(gpu="1"), volumes=[{"name": "h", "hostPath": {"path": "/usr/local"}}]),
            "shim-host-path",
        ),
        (
            pod(
                container(gpu="1"),
                volumes=[{"name": "h", "hostPath": {"path": "/usr/local/vgpu/"}}],
            ),
            "shim-host-path",
        ),
        (  # the webhook's own volume (a re-review) does not end the check of the rest
            pod(
                container(gpu="1"),
                volumes=[
                    {
                        "name": "gpushare-shim",
                        "hostPath": {"path": "/usr/local/vgpu", "type": "Directory"},
                    },
                    {"name": "h", "hostPath": {"path": "/usr/local/vgpu"}},
                ],
            ),
            "shim-host-path",
        ),
        (pod(container(gpu="1", env="A=B")), "malformed-object"),
        (pod(container(gpu="1", env=[{"value": "x"}])), "malformed-object"),
        (pod(container(gpu="1", volumeMounts={"a": 1})), "malformed-object"),
        (pod(container(gpu="1"), volumes=["x"]), "malformed-object"),
        (
            pod(container(gpu="1", resources={"limits": {GPU: "1"}, "requests": ["x"]})),
            "malformed-object",
        ),
        (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"annotations": []},
                "spec": {"containers": [container(gpu="1")]},
            },
            "malformed-object",
        ),
        ("not a pod", "malformed-object"),
    ],
    ids=[
        "file-over-shim",
        "shim-volume-elsewhere",
        "host-parent",
        "host-same",
        "host-after-own-volume",
        "env-string",
        "env-no-name",
        "mounts-dict",
        "volume-string",
        "requests-list",
        "annotations-list",
        "string",
    ],
)
def test_rejections(obj: Any, reason: str) -> None:
    decision = decide(obj)
    assert not decision.allowed
    assert decision.reason == reason, decision.message
    assert decision.message


@pytest.mark.parametrize(
    ("obj", "reasons"),
    [
        (  # one per container, in the pod's order, init containers first
            pod(
                container("a", gpu="2.5"),
                container("b", gpu="99"),
                init=[container("i", gpu="1", securityContext={"privileged": True})],
            ),
            ["privileged", "fractional", "exceeds-gpu"],
        ),
        (  # placement, confinement and volumes are each checked
            pod(
                container("a", gpu="1", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
                nodeName="n1",
                schedulerName="other",
                hostPID=True,
                volumes=[{"name": "h", "hostPath": {"path": "/usr/local/vgpu"}}],
            ),
            ["node-name", "scheduler-name", "host-pid", "visible-devices", "shim-host-path"],
        ),
        (  # a container that is too big alone is not also counted in the pod's total
            pod(container("a", gpu="20"), container("b", gpu="4")),
            ["exceeds-gpu"],
        ),
        (  # shapes: each wrong field is named, the rest still checked
            pod(
                container("a", gpu="1", env="A=B", volumeMounts={"a": 1}),
                container("b", gpu="1", env=[{"name": "LD_PRELOAD", "valueFrom": {}}]),
                volumes=["x"],
            ),
            ["malformed-object", "malformed-object", "malformed-object", "preload-value-from"],
        ),
    ],
    ids=["per-container", "per-rule", "no-double-count", "shapes"],
)
def test_every_problem_is_named_in_one_answer(obj: Any, reasons: list[str]) -> None:
    decision = decide(obj)
    assert not decision.allowed
    assert [p.reason for p in decision.problems] == reasons
    assert decision.reason == reasons[0]
    if len(reasons) > 1:
        assert decision.message.startswith(f"the pod has {len(reasons)} problems: (1) ")
        for number, problem in enumerate(decision.problems, start=1):
            assert f"({number}) {problem.message}" in decision.message
    else:
        assert decision.message == decision.problems[0].message


def test_a_pod_with_many_problems_hears_how_many_more() -> None:
    many = [container(f"c{i}", gpu="99") for i in range(14)]
    decision = decide(pod(*many))
    assert len(decision.problems) == 14
    assert "(10) " in decision.message
    assert "(11) " not in decision.message
    assert decision.message.endswith("; and 4 more")


def test_one_problem_reads_as_before() -> None:
    decision = decide(pod(container(gpu="99")))
    assert len(decision.problems) == 1
    assert not decision.message.startswith("the pod has")


def test_a_problem_of_a_fields_shape_carries_the_fields_path() -> None:
    shapes = pod(
        container("a", gpu="1", env="A=B", volumeMounts={"a": 1}),
        container("b", gpu="1", env=[{"name": "LD_PRELOAD", "valueFrom": {}}]),
        volumes=["x"],
    )
    assert [(p.reason, p.path) for p in decide(shapes).problems] == [
        ("malformed-object", "spec.volumes[0]"),
        ("malformed-object", "spec.containers[0].env"),
        ("malformed-object", "spec.containers[0].volumeMounts"),
        ("preload-value-from", ""),
    ]
    meta = {**pod(container("a", gpu="1.5")), "metadata": {"labels": "x", "annotations": []}}
    assert [(p.reason, p.path) for p in decide(meta).problems] == [
        ("malformed-object", "metadata.labels"),
        ("fractional", ""),
        ("malformed-object", "metadata.annotations"),
    ]
    (whole,) = decide([]).problems
    assert (whole.reason, whole.path, whole.code) == ("malformed-object", "object", 400)


def test_shape_errors_are_400_and_name_the_field() -> None:
    decision = decide(pod(container(gpu="1", env="A=B")))
    assert decision.code == 400
    assert "env" in decision.message
    assert "expected a list" in decision.message


def test_demand_is_what_the_scheduler_reserves() -> None:
    apps = (container("a", gpu="4"), container("b", gpu="6"))
    assert decide(pod(*apps, init=[container("i", gpu="8")])).gpu_pod.held_per_gpu == 10
    assert decide(pod(container("a", gpu="16"))).allowed
    assert not decide(pod(container("a", gpu="16"), container("b", gpu="1"))).allowed
    # The extender reserves the app containers' sum: an init container above it is refused.
    bigger_init = pod(container("a", gpu="4"), init=[container("i", gpu="12")])
    assert decide(bigger_init).reason == "init-exceeds-reservation"
    # ACK's scheduler counts like kube-scheduler: the larger of the sum and the largest init.
    ack = parse_policy({"scheduler": "ack"})
    assert plan(bigger_init, Prepared(ack), namespace="team-a").gpu_pod.held_per_gpu == 12


def test_excluded_namespace_is_untouched() -> None:
    decision = plan(pod(container(gpu="99")), Prepared(DEFAULT_POLICY), namespace="kube-system")
    assert decision.outcome == "untouched"
    assert decision.reason == "excluded-namespace"


NODES = [
    GpuNode("a100-1", 80, 8, {"pool": "a100"}),
    GpuNode("a100-2", 80, 8, {"pool": "a100"}),
    GpuNode("t4-1", 16, 4, {"pool": "t4", "zone": "z1"}),
]


@pytest.mark.parametrize(
    ("spec", "largest", "count", "gpus"),
    [
        ({}, 80, 2, 8),
        ({"nodeSelector": {"pool": "t4"}}, 16, 1, 4),
        ({"nodeSelector": {"pool": "v100"}}, 16, None, 8),  # the policy's, as none matches
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "In", "values": ["t4"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            16,
            1,
            4,
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}
                            ]
                        }
                    }
                }
            },
            80,
            2,
            8,
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "NotIn", "values": ["a100"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            16,
            1,
            4,
        ),
    ],
    ids=[
        "all",
        "selector",
        "no-match",
        "affinity-in",
        "affinity-does-not-exist",
        "affinity-not-in",
    ],
)
def test_limits_follow_node_selection(
    spec: dict[str, Any], largest: int, count: int, gpus: int
) -> None:
    # Worked out afresh, or kept by the prepared policy (nodes in any order):
    # all must say the same, the second time too.
    for nodes in (NODES, NODES[::-1]):
        prepared = Prepared(DEFAULT_POLICY, nodes)
        for limits in (
            bounds_over(spec, nodes, DEFAULT_POLICY),
            prepared.bounds(spec),
            prepared.bounds(spec),
        ):
            assert (limits.largest_gpu, limits.nodes_with_largest, limits.max_gpus) == (
                largest,
                count,
                gpus,
            )


def test_a_prepared_policy_keeps_bounds_by_placement_for_its_own_node_list() -> None:
    spec = {"nodeSelector": {"pool": "t4"}}
    before = Prepared(DEFAULT_POLICY, NODES)
    assert before.bounds(spec).largest_gpu == 16
    assert before.bounds({}).largest_gpu == 80
    bigger = [*NODES, GpuNode("t4-big", 24, 1, {"pool": "t4"}), GpuNode("h100", 94, 8, {})]
    after = Prepared(DEFAULT_POLICY, bigger)
    assert after.bounds(spec).largest_gpu == 24
    assert after.bounds({}).largest_gpu == 94
    assert before.bounds(spec).largest_gpu == 16  # each list its own bounds
    # The same selector written in another key order is the same placement.
    both = {"nodeSelector": {"zone": "z1", "pool": "t4"}}
    again = {"nodeSelector": {"pool": "t4", "zone": "z1"}}
    assert after.bounds(both) is after.bounds(again)
    assert after.bounds(both).largest_gpu == 16
    # The node affinity is part of the placement: no selector, other affinities.
    t4_only = {"affinity": _affinity("pool", "In", ["t4"])}
    a100_only = {"affinity": _affinity("pool", "In", ["a100"])}
    assert after.bounds(t4_only).largest_gpu == 24
    assert after.bounds(a100_only).largest_gpu == 80


def test_a_prepared_policy_without_nodes_bounds_by_the_policy() -> None:
    policy = parse_policy({"gpuMemory": 40})
    assert Prepared(policy, note="no node list").bounds({}).largest_gpu == 40
    assert Prepared(policy, []).nodes is None


def _affinity(key: str, operator: str, values: list[str]) -> dict[str, Any]:
    expression = {"key": key, "operator": operator, "values": values}
    term = {"matchExpressions": [expression]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def test_cluster_limits_reach_the_message() -> None:
    obj = pod(container(gpu="24"), nodeSelector={"pool": "t4"})
    decision = decide(obj, bounds=bounds_over(obj["spec"], NODES, DEFAULT_POLICY))
    assert not decision.allowed
    assert "16 GiB (1 node of the GPU nodes this pod's node selector allows)" in decision.message
    big = pod(container(gpu="24"))
    assert decide(big, bounds=bounds_over(big["spec"], NODES, DEFAULT_POLICY)).allowed


def test_proportional_compute_uses_the_largest_gpu() -> None:
    policy = parse_policy_text("compute: {default: proportional}")
    obj = pod(container(gpu="5"))
    out = apply(obj, list(plan(obj, Prepared(policy)).patch))
    assert env_of(out["spec"]["containers"][0])["CUDA_DEVICE_SM_LIMIT"] == "32"  # 5/16 rounded up
    fixed = parse_policy_text("compute: {default: 20}")
    out = apply(obj, list(plan(obj, Prepared(fixed)).patch))
    assert env_of(out["spec"]["containers"][0])["CUDA_DEVICE_SM_LIMIT"] == "20"
    plain = apply(obj, list(plan(obj, Prepared(DEFAULT_POLICY)).patch))
    assert "CUDA_DEVICE_SM_LIMIT" not in env_of(plain["spec"]["containers"][0])


# -- enforcement: warn --

WARN = parse_policy_text("enforcement: warn")


def warned(obj: Any, policy: Any = WARN) -> Decision:
    decision = plan(obj, Prepared(policy), namespace="team-a")
    assert decision.outcome == "warned", decision
    assert decision.allowed
    return decision


@pytest.mark.parametrize(
    ("obj", "reasons", "set_up"),
    [
        (pod(container(gpu="40")), ("exceeds-gpu",), ["main"]),
        (pod(container(gpu="4"), nodeName="n1"), ("node-name",), ["main"]),
        (pod(container(gpu="4"), hostPID=True), ("host-pid",), ["main"]),
        (
            pod(container(gpu="4"), container("bad", gpu="4Gi")),
            ("unit-confusion",),
            ["main"],
        ),
        (pod(container(gpu="0.5")), ("fractional",), []),
        (
            pod(container(gpu="4", securityContext={"privileged": True})),
            ("privileged",),
            ["main"],
        ),
        (
            pod(container(gpu="4", volumeMounts=[{"name": "x", "mountPath": "/usr/local/vgpu"}])),
            ("shim-mount",),
            [],
        ),
        (
            pod(container(gpu="4", env=[{"name": "LD_PRELOAD", "valueFrom": {}}])),
            ("preload-value-from",),
            [],
        ),
        (pod(container(gpu="4"), volumes=[{"name": "gpushare-shim"}]), ("reserved-volume",), []),
        (pod(container(gpu="4", env="A=B")), ("malformed-object",), []),
    ],
    ids=[
        "exceeds-gpu",
        "node-name",
        "host-pid",
        "one-container-unreadable",
        "no-container-readable",
        "privileged",
        "shim-mount",
        "preload-value-from",
        "reserved-volume",
        "malformed",
    ],
)
def test_under_warn_a_pod_is_admitted_with_every_refusal_as_a_warning(
    obj: Any, reasons: tuple[str, ...], set_up: list[str]
) -> None:
    refused = decide(obj)
    assert not refused.allowed
    decision = warned(obj)
    assert decision.reasons == reasons == refused.reasons
    assert decision.reason == refused.reason
    assert decision.message == refused.message
    assert [w for w in decision.warnings if w.startswith(WOULD_REFUSE)] == [
        f"{WOULD_REFUSE}{p.message}" for p in refused.problems
    ]
    # What is set up: the containers whose asks were read, when nothing clashes.
    after = apply(obj, list(decision.patch))
    limited = [
        c["name"]
        for c in after["spec"]["containers"]
        if isinstance(c.get("env"), list)
        and any(e.get("name") == "CUDA_DEVICE_MEMORY_LIMIT" for e in c["env"])
    ]
    assert limited == set_up
    assert bool(decision.ops) == bool(set_up)
    again = plan(after, Prepared(WARN), namespace="team-a")  # a fixed point, warned again
    assert again.outcome == "warned"
    assert again.ops == ()


def test_under_warn_another_scheduler_is_kept() -> None:
    obj = pod(container(gpu="4"), schedulerName="volcano")
    after = apply(obj, list(warned(obj).patch))
    assert after["spec"]["schedulerName"] == "volcano"
    assert env_of(after["spec"]["containers"][0])["CUDA_DEVICE_MEMORY_LIMIT"] == "4096m"


def test_under_warn_a_pod_that_breaks_no_rule_is_mutated_as_usual() -> None:
    obj = pod(container(gpu="4"))
    decision = plan(obj, Prepared(WARN), namespace="team-a")
    assert decision.outcome == "mutated"
    assert decision.patch == decide(obj).patch
    assert decision.warnings == ()


def test_under_warn_an_ephemeral_container_is_warned() -> None:
    obj = pod(
        container(gpu="4"),
        ephemeralContainers=[container("debug", securityContext={"privileged": True})],
    )
    assert plan_ephemeral(obj, DEFAULT_POLICY, namespace="team-a").outcome == "rejected"
    decision = plan_ephemeral(obj, WARN, namespace="team-a")
    assert decision.outcome == "warned"
    assert decision.reasons == ("privileged",)
    assert decision.ops == ()


def test_warn_is_per_namespace_when_the_policy_says_so() -> None:
    policy = parse_policy_text("namespaces: {team-a: {enforcement: warn}}")
    obj = pod(container(gpu="40"))
    assert plan(obj, Prepared(policy), namespace="team-a").outcome == "warned"
    assert plan(obj, Prepared(policy), namespace="team-b").outcome == "rejected"


def test_one_prepared_policy_answers_each_pod_as_a_fresh_one_would() -> None:
    """What the prepared policy keeps is kept per ask, LD_PRELOAD and placement, never shared
    between pods that differ in them: a server answers every review with one."""
    ours = [{"name": "LD_PRELOAD", "value": "/opt/a.so"}]
    theirs = [{"name": "LD_PRELOAD", "value": "/opt/b.so"}]
    pods = [
        pod(container(gpu="4", env=ours)),
        pod(container(gpu="8", env=theirs)),
        pod(container(gpu="4", env=theirs), container("two", gpu="2")),
        pod(container(gpu="4"), nodeSelector={"pool": "t4"}),
        pod(container(gpu="4"), nodeSelector={"pool": "a100"}),
        pod(container(gpu="16"), nodeSelector={"pool": "t4"}),
    ]
    shared = Prepared(DEFAULT_POLICY, NODES)
    for obj in [*pods, *reversed(pods)]:
        alone = Prepared(DEFAULT_POLICY, NODES)
        spec = obj["spec"]
        got = plan(obj, shared, namespace="team-a", bounds=shared.bounds(spec))
        expected = plan(obj, alone, namespace="team-a", bounds=alone.bounds(spec))
        assert (got.outcome, got.message, got.patch) == (
            expected.outcome,
            expected.message,
            expected.patch,
        )


def test_the_patch_as_json_data_is_a_copy_of_its_own() -> None:
    """Ops share the layout's values with every patch of the policy; a copy can be changed."""
    decision = decide(pod(container(gpu="4")))
    first = decision.patch
    for op in first:
        if isinstance(op.get("value"), list):
            op["value"].clear()
    assert decision.patch != first
    assert all(op.get("value") != [] for op in decision.patch)


def test_the_visible_devices_advice_reads_the_containers_limit_of_gpu_memory() -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    requested = container("a", env=env, resources={"requests": {"aliyun.com/gpu-mem": "4"}})
    messages = [p.message for p in decide(pod(requested)).problems]
    assert any("remove the variable and ask for aliyun.com/gpu-mem" in m for m in messages)
