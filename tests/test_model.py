"""One model of a GPU pod: every reader of a pod's GPU memory takes it from there.

A property over drawn pods and every scheduler kind holds the fit rules
(the decision's model), the status annotation, the admission metric, the
log line, ``report`` (the pod's row and its GPU's, under DRA its devices'
from the claims a scheduler allocates), ``top`` and the preview
to the model of the pod; table cases hold the model to each scheduler's
own rule.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.draclaims import allocate
from tests.helpers import GPU, apply, container, examples, pod, review
from webhook.decision.admission import Result, admit
from webhook.decision.model import GpuPod, gpu_pod, stored_gpu_pod
from webhook.decision.plan import STATUS_ANNOTATION
from webhook.decision.plan import plan as decide
from webhook.decision.policy import Policy, parse_policy
from webhook.decision.prepared import Prepared
from webhook.decision.quantities import BYTES_PER_MIB
from webhook.decision.schedulers import SCHEDULERS
from webhook.preview import preview
from webhook.report import reserved
from webhook.report.claims import read_claims
from webhook.report.findings import build_report, judge_pod
from webhook.report.objects import sort_objects
from webhook.report.top import build_top
from webhook.serving.app import log_admission
from webhook.serving.metrics import reserved_bytes

COUNT = "aliyun.com/gpu-count"
NOW = datetime(2026, 12, 4, 18, 0, tzinfo=UTC)
NODE = {
    "metadata": {"name": "gpu-a"},
    "status": {"capacity": {GPU: "512", COUNT: "8"}},
}


def _policy(kind: str) -> Policy:
    # warn: a pod that breaks a rule is still set up, so every reader sees it
    return parse_policy({"scheduler": kind, "enforcement": "warn", "gpuMemory": 64})


@st.composite
def _containers(draw: st.DrawFn, prefix: str, gpus: int) -> list[dict[str, Any]]:
    out = []
    for index in range(draw(st.integers(1, 3))):
        per_gpu = draw(st.one_of(st.none(), st.integers(1, 8)))
        total = None if per_gpu is None else str(per_gpu * gpus)  # split evenly over its GPUs
        out.append(container(f"{prefix}{index}", gpu=total))
    return out


@st.composite
def gpu_pods(draw: st.DrawFn, spans: bool) -> dict[str, Any]:
    """A pod of app and init containers, some asking GPU memory; over several GPUs if read."""
    gpus = draw(st.integers(1, 4)) if spans else 1
    apps = draw(_containers("c", gpus))
    inits = draw(st.one_of(st.none(), _containers("i", gpus)))
    labels = {COUNT: str(gpus)} if gpus > 1 else None
    return pod(*apps, init=inits, labels=labels)


def _logged(result: Result) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.__dict__["fields"])

    audit = logging.getLogger("gpushare_webhook.admission")
    keep, level = Keep(), audit.level
    audit.addHandler(keep)
    audit.setLevel(logging.INFO)
    try:
        log_admission(result, 0.001)
    finally:
        audit.removeHandler(keep)
        audit.setLevel(level)
    return seen[0]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(SCHEDULERS)).flatmap(
        lambda k: st.tuples(st.just(k), gpu_pods(SCHEDULERS[k].spans_gpus))
    )
)
def test_every_reader_of_a_pods_gpu_memory_agrees_with_its_model(
    drawn: tuple[str, dict[str, Any]],
) -> None:
    kind, obj = drawn
    policy = _policy(kind)
    prepared = Prepared(policy)
    model = stored_gpu_pod(obj, policy)
    if not model.asks:
        return  # no GPU memory asked: nothing to hold
    result = admit(json.dumps(review(obj)).encode(), prepared)
    decision = result.decision
    assert decision is not None
    assert decision.allowed, decision.message
    # The fit rules and the preview read the decision's model: the same one.
    assert decision.gpu_pod == model
    ((_, previewed),) = preview(obj, prepared).decisions
    assert previewed.gpu_pod == model
    # The status annotation, the metric and the log line.
    stored = apply(obj, list(decision.patch))
    status = json.loads(stored["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["demand"] == f"{model.held_per_gpu}{policy.memory_unit}"
    assert reserved_bytes(result) == model.held_per_pod_bytes
    logged = _logged(result)
    # (left out of the line of a pod its scheduler holds nothing for)
    assert (logged.get("gpu_memory_per_gpu", 0), logged.get("gpu_memory_per_pod", 0)) == (
        model.held_per_gpu,
        model.held_per_pod,
    )
    assert stored_gpu_pod(stored, policy) == model
    # report (the pod's row and its GPU's) and top, on the pod as bound.
    stored["spec"]["nodeName"] = "gpu-a"
    stored["metadata"]["uid"] = "4d1c6f0e"
    if policy.placed_by.claims:
        _claims_agree(stored, policy, prepared, model)
        return
    annotations = stored["metadata"]["annotations"]
    annotations[reserved.INDEX], annotations[reserved.RESERVED] = "0", str(model.app_per_gpu)
    assert stored_gpu_pod(stored, policy) == model
    finding = judge_pod(stored, prepared)
    assert finding is not None
    assert finding.held_per_pod == model.held_per_pod
    accounts = reserved.account([NODE], [stored], policy)
    held = [p.held_per_gpu for node in accounts.nodes for g in node.gpus for p in g.pods]
    assert held == ([model.held_per_gpu] if model.app_per_gpu else [])
    (row,) = build_top([stored], policy, {"gpu-a": []}).pods
    assert row.limit_bytes == model.held_per_pod_bytes


def _claims_agree(
    stored: dict[str, Any], policy: Policy, prepared: Prepared, model: GpuPod
) -> None:
    """Under DRA: the pod's row, its devices' rows (from the claims a scheduler would
    allocate for it, each consuming what it requests) and top, against the model."""
    claims = allocate(stored, policy)
    listed = [{"apiVersion": "v1", "kind": "Pod", **stored}, *claims]
    report = build_report(sort_objects(listed, "test"), policy, now=NOW)
    (row,) = report.pods
    assert row.held_per_pod == model.held_per_pod
    assert row.claimed_bytes == model.held_per_pod_bytes
    assert not [f for f in row.findings if "claim" in f]  # limits and claims agree
    shares = [h.held_bytes for device in report.devices for h in device.held]
    unit = policy.mib_per_unit * BYTES_PER_MIB
    assert sum(shares) == model.held_per_pod_bytes
    assert max(shares) == model.held_per_gpu * unit  # each claim on a GPU of its own
    held = read_claims([stored], claims, [], policy)
    (top,) = build_top([stored], policy, {"gpu-a": []}, held).pods
    assert top.limit_bytes == top.reserved_bytes == model.held_per_pod_bytes
    assert sum(g.reserved_bytes for g in build_top([stored], policy, {}, held).gpus) == sum(shares)


def _asks(*memory: tuple[str, int]) -> dict[str, Any]:
    apps = [
        container(f"c{n}", gpu=str(m or "") or None)
        for n, (k, m) in enumerate(memory)
        if k == "app"
    ]
    inits = [container(f"i{n}", gpu=str(m)) for n, (k, m) in enumerate(memory) if k == "init"]
    return pod(*apps, init=inits or None)


@pytest.mark.parametrize(
    ("kind", "memory", "per_gpu", "per_pod"),
    [
        # The extender holds its app containers' sum (GetGPUMemoryFromPodResource):
        ("gpushare-extender", [("app", 4), ("app", 4)], 8, 8),
        ("gpushare-extender", [("app", 4), ("app", 4), ("init", 12)], 8, 8),
        ("gpushare-extender", [("app", 4), ("init", 2)], 4, 4),
        # ACK's scheduler holds as kube-scheduler does: the larger phase.
        ("ack", [("app", 4), ("app", 4), ("init", 12)], 12, 12),
        ("ack", [("app", 4), ("app", 4), ("init", 6)], 8, 8),
        ("ack", [("app", 0), ("init", 3)], 3, 3),
        ("gpushare-extender", [("app", 0), ("init", 3)], 0, 0),
        # Under DRA each container holds its own claim: the largest on a GPU, all in the pod.
        ("dra", [("app", 4), ("app", 4), ("init", 12)], 12, 20),
        ("dra", [("app", 0)], 0, 0),
    ],
)  # fmt: skip
def test_what_each_scheduler_kind_holds(
    kind: str, memory: list[tuple[str, int]], per_gpu: int, per_pod: int
) -> None:
    policy = _policy(kind)
    model = stored_gpu_pod(_asks(*memory), policy)
    assert (model.held_per_gpu, model.held_per_pod) == (per_gpu, per_pod)
    assert model == gpu_pod(model.asks, policy)


def test_under_ack_a_pod_over_several_gpus_holds_its_share_on_each() -> None:
    policy = _policy("ack")
    obj = pod(container("a", gpu="8"), init=[container("i", gpu="12")], labels={COUNT: "2"})
    model = stored_gpu_pod(obj, policy)
    assert (model.gpus, model.app_per_gpu, model.largest_init_per_gpu) == (2, 4, 6)
    assert (model.held_per_gpu, model.held_per_pod) == (6, 12)
    assert model.held_per_pod_bytes == 12 * 2**30
    app_only = stored_gpu_pod(pod(container("a", gpu="8"), labels={COUNT: "2"}), policy)
    assert (app_only.app_per_gpu, app_only.held_per_gpu, app_only.held_per_pod) == (4, 4, 8)


def test_a_stored_pod_is_read_as_admission_reads_it_and_an_unreadable_ask_adds_nothing() -> None:
    policy = parse_policy({"compute": {"default": "proportional"}, "gpuMemory": 16})
    readable, fractional = container("a", gpu="4"), container("b", gpu="1500m")
    model = stored_gpu_pod(pod(readable, fractional), policy)
    assert [(a.name, a.memory_per_gpu, a.compute) for a in model.asks] == [("a", 4, 25)]
    no_metadata = {"spec": {"containers": [readable]}}
    assert stored_gpu_pod(no_metadata, policy).held_per_pod == 4
    no_spec = stored_gpu_pod({"metadata": {"name": "x"}}, policy)
    assert (no_spec.asks, no_spec.held_per_pod, no_spec.mib_per_unit) == ((), 0, 1024)


def test_a_pod_already_set_up_is_unchanged_and_says_so() -> None:
    policy = _policy("gpushare-extender")
    obj = pod(container("a", gpu="4"))
    stored = apply(obj, list(decide(obj, Prepared(policy)).patch))
    again = decide(stored, Prepared(policy))
    assert (again.outcome, again.reason, again.ops) == ("unchanged", "unchanged", ())


def test_an_init_container_asking_a_gpu_count_the_scheduler_does_not_read_is_named() -> None:
    policy = parse_policy({"multiGpu": {"countFrom": "resource"}})
    warm = container("warm", gpu="4")
    warm["resources"]["limits"][COUNT] = "2"
    (problem,) = decide(pod(container("a", gpu="4"), init=[warm]), Prepared(policy)).problems
    assert problem.message.startswith(f"init container 'warm' limit {COUNT} asks 2 GPUs")
