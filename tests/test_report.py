"""``gpushare-webhook report --from``: golden outputs from a list a real API server saved.

``tests/report/cluster.json`` is ``kubectl get pods,deployments,statefulsets,
daemonsets,jobs,cronjobs,replicasets,nodes -A -o json`` of the scene
tests/apiserver/test_report.py makes (a confined pod, one that slipped past
the webhook, one it would refuse, one warned, two Deployments, two GPU
nodes), judged by ``tests/report/policy.yaml``. ``tests/report/extender.json``
is a list of the same shape where the GPU Share Scheduler Extender placed
pods (its annotations), with the cases its counting rules tell apart;
``extender-inspect.json`` is what its inspect endpoint answers for it, read
from its rules by hand. The table and the JSON are goldens
(``GOLDEN_UPDATE=1`` rewrites them); malformed and partial input is one line
and exit 2. The clock is fixed: a few minutes after the lists were saved.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import apply, container, pod
from webhook.cli import build_parser
from webhook.cli.report import cmd_report
from webhook.decision.plan import plan
from webhook.decision.policy import DEFAULT_POLICY, Policy, parse_policy_text
from webhook.decision.prepared import Prepared
from webhook.report import reserved
from webhook.report.findings import OTHER_POLICY, build_report, judge_pod
from webhook.report.objects import sort_objects
from webhook.report.render import as_table

HERE = Path(__file__).parent / "report"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"
NOW = datetime(2026, 12, 4, 18, 0, tzinfo=UTC)  # the lists were saved a few minutes before


def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parsed = build_parser().parse_args(["report", *args])
    code = cmd_report(parsed, io.StringIO(stdin), out, err, clock=lambda: NOW)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("output", ["table", "json"])
@pytest.mark.parametrize("scene", ["", "extender-"])
def test_the_report_of_a_saved_list_is_its_golden(scene: str, output: str) -> None:
    listed = HERE / ("cluster.json" if not scene else f"{scene[:-1]}.json")
    args = ["--from", str(listed), "--policy", str(HERE / "policy.yaml")]
    code, out, _ = run(*args, "--output", output)
    assert code == 1  # drift and refusals: fit for a CronJob or CI
    golden = HERE / (f"{scene}expected.txt" if output == "table" else f"{scene}expected.json")
    if UPDATE:
        golden.write_text(out)
    assert out == golden.read_text()


def test_the_report_gives_the_answer_the_extenders_inspect_endpoint_gives() -> None:
    args = ["--from", str(HERE / "extender.json"), "--policy", str(HERE / "policy.yaml")]
    _, out, _ = run(*args, "-o", "json")
    nodes = json.loads(out)["nodes"]
    inspected = {
        "nodes": [
            {
                "name": node["name"],
                "totalGPU": node["total"],
                "usedGPU": node["used"],
                "devs": [
                    {
                        "id": gpu["index"],
                        "totalGPU": gpu["total"],
                        "usedGPU": gpu["used"],
                        "pods": [
                            {
                                "name": p["name"],
                                "namespace": p["namespace"],
                                "usedGPU": p["heldPerGpu"],
                            }
                            for p in gpu["pods"]
                        ],
                    }
                    for gpu in node["devices"]
                ],
            }
            for node in nodes
        ]
    }
    assert inspected == json.loads((HERE / "extender-inspect.json").read_text())
    for node in nodes:  # the used memory is what the pods of its GPUs have reserved
        assert node["used"] == sum(p["reserved"] for g in node["devices"] for p in g["pods"])


def test_the_json_has_its_documented_shape() -> None:
    args = ["--from", str(HERE / "cluster.json"), "--policy", str(HERE / "policy.yaml")]
    _, out, _ = run(*args, "-o", "json")
    found = json.loads(out)
    assert list(found) == [
        "apiVersion", "kind", "unit", "clean", "summary", "pods", "workloads", "nodes",
        "draDevices", "unanswered", "refusedByGuard", "findings", "notes",
    ]  # fmt: skip
    assert (found["apiVersion"], found["kind"], found["clean"]) == (
        "gpushare-webhook.io/v1",
        "Report",
        False,
    )
    assert found["summary"]["pods"] == {
        "confined": 2, "drifted": 1, "would-be-refused": 1, "warned": 1, "excluded": 0,
    }  # fmt: skip
    assert (found["summary"]["unaccounted"], found["summary"]["unanswered"]) == (3, 2)
    assert set(found["pods"][0]) == {
        "namespace", "name", "node", "status", "gpuMemory", "withoutLimit", "findings", "cause",
        "gpu", "reserved", "usedBytes", "draDevices", "claimedBytes",
    }  # fmt: skip
    assert {p["usedBytes"] for p in found["pods"]} == {None}  # --from: no agent to ask
    assert set(found["nodes"][0]) == {
        "name", "gpus", "memoryPerGpu", "total", "used", "free", "pods", "withoutLimit",
        "unaccounted", "devices",
    }  # fmt: skip
    assert set(found["nodes"][0]["devices"][0]) == {"index", "total", "used", "free", "pods"}
    assert set(found["unanswered"][0]) == {"schedulerName", "pods", "message"}
    (refused,) = found["refusedByGuard"]  # the latest of its two; not the quota's, not a success
    assert refused == {
        "namespace": "ml",
        "kind": "ReplicaSet",
        "name": "infer-7d4b9",
        "count": 14,
        "lastSeen": "2026-12-01T10:00:00Z",
        "message": refused["message"],
    }
    assert refused["message"].startswith("gpushare-webhook guard: the pod lacks")
    assert "CUDA_DEVICE_MEMORY_LIMIT=4096m" in refused["message"]
    readme = (Path(__file__).parent.parent / "docs" / "report.md").read_text()
    keys = ("gpuMemory", "withoutLimit", "memoryPerGpu", "would-be-refused", "clean", "used")
    for key in (*keys, "unaccounted", "devices", "unanswered", "schedulerName", "reserved",
                "refusedByGuard", "lastSeen", "usedBytes"):  # fmt: skip
        assert f"`{key}`" in readme, key


def test_one_namespace_and_a_clean_one() -> None:
    args = ["--from", str(HERE / "cluster.json"), "--policy", str(HERE / "policy.yaml")]
    code, out, _ = run(*args, "-o", "json", "-n", "report-confined")
    found = json.loads(out)
    assert {p["namespace"] for p in found["pods"]} == {"report-confined"}
    assert code == 1  # its Deployment "bytes" would be refused
    spec = {"containers": [{"name": "c", "image": "x"}]}
    metadata = {"name": "p", "namespace": "a"}
    single = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    code, out, _ = run("--from", "-", stdin=single)
    assert code == 0
    assert "(all confined)" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "standard input holds no objects"),
        ('{"kind": "List", "apiVersion": "v1", "items": [', "is not valid YAML or JSON"),
        ('{"kind": "List", "apiVersion": "v1", "items": [3]}', "item 1 is not an object (a int)"),
        ('{"kind": "List", "apiVersion": "v1", "items": [{"metadata": {"name": "x"}}]}',
         "item 1 has no kind or apiVersion"),
        ('{"kind": "List", "apiVersion": "v1", "items": [{"kind": "Pod", "apiVersion": "v1"}]}',
         "item 1 (Pod) has no metadata.name"),
        ('{"kind": "List", "apiVersion": "v1", "items": [{"kind": "Pod", "apiVersion": "v1", '
         '"metadata": {"name": "p"}}]}', "item 1 (p) has no metadata.namespace"),
        ('{"kind": "List", "apiVersion": "v1", "items": [], "items": []}',
         "key 'items' appears twice in one mapping"),
    ],
    ids=["empty", "truncated", "not-an-object", "no-kind", "no-name", "no-namespace", "twice"],
)  # fmt: skip
def test_malformed_or_partial_input_is_one_line_and_exit_2(text: str, message: str) -> None:
    done = _report_of_stdin(text)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpushare-webhook: standard input")
    assert message in line


def test_a_truncated_saved_list_is_refused_whole() -> None:
    done = _report_of_stdin((HERE / "cluster.json").read_text()[:20000])
    assert done.returncode == 2
    assert "is not valid YAML or JSON" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def _report_of_stdin(text: str) -> subprocess.CompletedProcess[str]:
    """``report --from -`` run as a user runs it, reading ``text``."""
    return subprocess.run(
        [sys.executable, "-m", "webhook", "report", "--from", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _stored(obj: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """``obj`` as the API server stores it after the webhook under ``policy`` set it up."""
    decision = plan(obj, Prepared(policy), namespace="team-a")
    return apply(obj, list(decision.patch))


def test_a_pod_set_up_under_another_policy_has_drifted_and_says_what_differs() -> None:
    older = parse_policy_text("env: {memoryLimit: GPU_MEMORY_LIMIT}")
    found = judge_pod(_stored(pod(container(gpu="4")), older), Prepared(DEFAULT_POLICY))
    assert found is not None
    assert (found.status, found.cause) == ("drifted", OTHER_POLICY)
    assert "container 'main': no CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_LIMIT_0" in (
        found.findings
    )
    assert found.unlimited  # the shim reads no GPU_MEMORY_LIMIT
    same = judge_pod(_stored(pod(container(gpu="4")), DEFAULT_POLICY), Prepared(DEFAULT_POLICY))
    assert same is not None
    assert same.status == "confined"


def test_a_pod_set_up_before_the_shim_moved_has_drifted_not_been_refused() -> None:
    """Its own volume and mount, where the policy no longer puts them, are the webhook's."""
    older = parse_policy_text("shim: {hostPath: /opt/shim, mountPath: /opt/shim}")
    stored = _stored(pod(container(gpu="4")), older)
    found = judge_pod(stored, Prepared(DEFAULT_POLICY))
    assert found is not None
    assert (found.status, found.cause) == ("drifted", OTHER_POLICY)
    assert any("a name the webhook reserves" in finding for finding in found.findings)
    del stored["metadata"]["annotations"]  # not the webhook's doing: a pod's own clash
    assert judge_pod(stored, Prepared(DEFAULT_POLICY)).status == "would-be-refused"  # type: ignore[union-attr]


def test_a_pod_set_up_before_the_init_step_is_confined_and_one_half_set_up_has_drifted() -> None:
    """The step and the fallback mounts are newer parts: their absence alone is no drift."""
    now = Prepared(parse_policy_text("shim: {initRegions: true}"))
    before = _stored(pod(container(gpu="4")), DEFAULT_POLICY)
    assert judge_pod(before, now).status == "confined"  # type: ignore[union-attr]
    after = _stored(pod(container(gpu="4")), now.policy)
    assert judge_pod(after, now).status == "confined"  # type: ignore[union-attr]
    assert after["spec"]["initContainers"][0]["name"] == "gpushare-regions"
    del after["spec"]["containers"][0]["volumeMounts"][-1]  # the step, but no fallback mount
    half = judge_pod(after, now)
    assert half is not None
    assert half.status == "drifted"
    assert any("/tmp/cudevshr.cache" in finding for finding in half.findings), half.findings


def test_what_a_report_leaves_out_and_what_it_says_so() -> None:
    running = pod(container(gpu="4"))
    finished = pod(container(gpu="4")) | {"status": {"phase": "Succeeded"}}
    web = pod(container("web"))
    excluded = pod(container(gpu="4"))
    excluded["metadata"] = {"name": "sys", "namespace": "kube-system"}
    template = {"template": {"spec": running["spec"]}}
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": template}
    owner["metadata"] = {"name": "d", "namespace": "team-a"}
    controller = {"kind": "Deployment", "name": "d", "controller": True}
    owned = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "spec": template}
    owned["metadata"] = {"name": "d-1", "namespace": "team-a", "ownerReferences": [controller]}
    objects = sort_objects([running, finished, web, excluded, owner, owned], "test")
    assert (len(objects.pods), objects.finished) == (3, 1)
    assert (len(objects.workloads), objects.owned) == (1, 1)
    report = build_report(objects, DEFAULT_POLICY, now=NOW)
    assert [(p.namespace, p.status) for p in report.pods] == [
        ("kube-system", "excluded"),
        ("team-a", "drifted"),
    ]
    assert [(w.kind, w.status) for w in report.workloads] == [("Deployment", "ok")]
    assert report.notes == (
        "1 finished pods left out: they hold no GPU",
        "no Node in the input: GPU sizes come from the policy's gpuMemory",
    )


def test_kubectl_finds_the_plugin() -> None:
    """``kubectl gpushare``: kubectl runs ``kubectl-gpushare`` from the PATH, with the rest."""
    done = subprocess.run(
        ["kubectl", "gpushare", "report", "--from", "-", "--frobnicate"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "kubectl gpushare: unrecognized arguments: --frobnicate (see kubectl gpushare --help)"
    )


def _node(name: str = "n1", **capacity: str) -> dict[str, Any]:
    """A Node with this capacity (``mem``, ``count``: the GPU-share resources)."""
    names = {"mem": "aliyun.com/gpu-mem", "count": "aliyun.com/gpu-count"}
    found = {names.get(k, k): v for k, v in capacity.items()}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"capacity": found}}  # fmt: skip


def _placed(
    limit: str | None = "4",
    *,
    index: str | None = "0",
    reserved: str | None = "4",
    node: str = "n1",
    phase: str = "Running",
    deleting: bool = False,
    init: str | None = None,
) -> dict[str, Any]:
    """A pod bound to ``node`` with the extender's annotations (None: that one left out)."""
    found = pod(container(gpu=limit), init=[container("init", gpu=init)] if init else None)
    found["spec"]["nodeName"] = node
    found["status"] = {"phase": phase}
    notes = {"ALIYUN_COM_GPU_MEM_IDX": index, "ALIYUN_COM_GPU_MEM_POD": reserved}
    found["metadata"]["annotations"] = {k: v for k, v in notes.items() if v is not None}
    if deleting:
        found["metadata"]["deletionTimestamp"] = "2026-12-04T17:58:00Z"
    return found


@pytest.mark.parametrize(
    ("node", "placed", "gpus", "per_gpu", "total", "counted", "used", "unaccounted"),
    [
        (_node(mem="80", count="2"), _placed(), 2, 40, 80, 0, 4, False),
        (_node(mem="80", count="2"), _placed(index="1"), 2, 40, 80, 1, 4, False),
        (_node(mem="80", count="2"), _placed(index=None), 2, 40, 80, None, 0, True),
        (_node(mem="80", count="2"), _placed(index="2"), 2, 40, 80, None, 0, True),
        (_node(mem="80", count="2"), _placed(index="-1"), 2, 40, 80, None, 0, True),
        (_node(mem="80", count="2"), _placed(index="one"), 2, 40, 80, None, 0, True),
        (_node(mem="80", count="2"), _placed(index=" 1"), 2, 40, 80, None, 0, True),
        (_node(mem="80", count="2"), _placed(index="+1"), 2, 40, 80, 1, 4, False),
        (_node(mem="80", count="2"), _placed(reserved="lots"), 2, 40, 80, 0, 0, False),
        (_node(mem="80", count="2"), _placed(reserved="-3"), 2, 40, 80, 0, 0, False),
        (_node(mem="80", count="2"), _placed(reserved=None), 2, 40, 80, 0, 0, False),
        (_node(mem="80", count="2"), _placed(reserved="6"), 2, 40, 80, 0, 6, False),
        (_node(mem="80", count="2"), _placed(phase="Succeeded"), 2, 40, 80, None, 0, False),
        (_node(mem="80", count="2"), _placed(phase="Failed"), 2, 40, 80, None, 0, False),
        (_node(mem="80", count="2"), _placed(deleting=True), 2, 40, 80, None, 0, False),
        (_node(mem="80", count="2"), _placed(limit=None, init="8"), 2, 40, 80, None, 0, False),
        (_node(mem="80", count="2"), _placed(limit="0"), 2, 40, 80, None, 0, False),
        (_node(mem="80", count="2"), _placed(init="20"), 2, 40, 80, 0, 4, False),
        (_node(mem="16"), _placed(), 0, 0, 16, None, 0, True),
        (_node(mem="16"), _placed(index=None), 0, 0, 16, None, 0, True),
        (_node(mem="30", count="4"), _placed(index="3", reserved="7"), 4, 7, 30, 3, 7, False),
        (_node(mem="30", count="4"), _placed(node="elsewhere"), 4, 7, 30, None, 0, False),
    ],
    ids=[
        "gpu-0", "gpu-1", "no-index", "index-out-of-range", "index-negative",
        "index-not-a-number", "index-with-a-space", "index-with-a-sign", "reserved-not-a-number",
        "reserved-negative", "no-reserved", "reserved-not-the-limit", "succeeded", "failed",
        "being-deleted", "init-container-memory-only", "limit-zero", "init-container-not-counted",
        "count-less-node", "count-less-node-no-index", "30-over-4-gpus", "another-node",
    ],
)  # fmt: skip
def test_what_the_extender_counts(
    node: dict[str, Any],
    placed: dict[str, Any],
    *,
    gpus: int,
    per_gpu: int,
    total: int,
    counted: int | None,
    used: int,
    unaccounted: bool,
) -> None:
    """Its rules, one case each: which GPU a pod is counted on, for how much, or not at all."""
    found = reserved.account([node], [placed], DEFAULT_POLICY)
    (record,) = found.nodes
    assert (len(record.gpus), record.capacity.per_gpu, record.capacity.total) == (
        gpus,
        per_gpu,
        total,
    )
    assert [g.total for g in record.gpus] == [per_gpu] * gpus
    assert found.placed.get(("team-a", "train")) == counted
    assert (record.used, sum(g.used for g in record.gpus)) == (used, used)
    assert record.free == per_gpu * gpus - used
    assert bool(record.unaccounted) == unaccounted
    if counted is not None:
        (reservation,) = record.gpus[counted].pods
        assert reservation.held_per_gpu == 4  # the app containers' limits; init ones never count
    assert found.elsewhere == (placed["spec"]["nodeName"] == "elsewhere")


def test_a_node_without_gpu_memory_is_no_gpu_node_and_quantities_read_as_go_reads_them() -> None:
    nodes = [_node("cpu", cpu="8"), _node("big", mem="1k", count="3")]
    found = reserved.account(nodes, [_placed("1500m", node="big")], DEFAULT_POLICY)
    (big,) = found.nodes  # "cpu" reports no GPU memory
    assert (big.capacity.total, big.capacity.per_gpu) == (1000, 333)
    (reservation,) = big.gpus[0].pods  # the extender counts it: Quantity.Value() rounds up
    assert reservation.held_per_gpu == 0  # but its ask is no whole count: the model holds none


def test_why_a_bound_pod_is_not_counted_is_said() -> None:
    found = reserved.account([_node(mem="80", count="2")], [_placed(index=None)], DEFAULT_POLICY)
    assert found.unaccounted[("team-a", "train")] == (
        "bound to n1 without the scheduler extender's ALIYUN_COM_GPU_MEM_IDX annotation: the "
        "scheduler did not reserve GPU memory for it (a pod placed past the extender), so it "
        "uses a GPU nobody accounts for"
    )
    found = reserved.account([_node(mem="16")], [_placed()], DEFAULT_POLICY)
    assert "'0' names no GPU of n1 (0 GPUs)" in found.unaccounted[("team-a", "train")]


def _waiting(
    age: float,
    *,
    scheduler: str | None = "gpushare-scheduler",
    phase: str = "Pending",
    conditions: list[dict[str, Any]] | None = None,
    node: str = "",
    gpu: str | None = "4",
    created: str | None = "",
) -> dict[str, Any]:
    found = pod(container(gpu=gpu))
    if scheduler:
        found["spec"]["schedulerName"] = scheduler
    if node:
        found["spec"]["nodeName"] = node
    made = NOW - timedelta(seconds=age)
    stamp = made.strftime("%Y-%m-%dT%H:%M:%SZ") if created == "" else created
    if stamp is not None:
        found["metadata"]["creationTimestamp"] = stamp
    found["status"] = {"phase": phase}
    if conditions is not None:
        found["status"]["conditions"] = conditions
    return found


UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
READY = [{"type": "Initialized", "status": "True"}]


@pytest.mark.parametrize(
    ("waiting", "named"),
    [
        (_waiting(300), "gpushare-scheduler"),
        (_waiting(61), "gpushare-scheduler"),
        (_waiting(60), None),
        (_waiting(5), None),
        (_waiting(300, scheduler=None), "default-scheduler"),
        (_waiting(300, scheduler="volcano"), "volcano"),
        (_waiting(300, conditions=UNSCHEDULABLE), None),
        (_waiting(300, conditions=READY), "gpushare-scheduler"),
        (_waiting(300, node="n1"), None),
        (_waiting(300, phase="Running"), None),
        (_waiting(300, gpu=None), None),
        (_waiting(300, created=None), None),
        (_waiting(300, created="yesterday"), None),
    ],
    ids=[
        "five-minutes", "just-over-a-minute", "a-minute", "seconds", "no-scheduler-name",
        "another-scheduler", "tried-and-failed", "other-conditions", "bound", "running",
        "not-a-gpu-pod", "no-creation-time", "creation-time-malformed",
    ],
)  # fmt: skip
def test_a_gpu_pod_no_scheduler_answers_is_named(
    waiting: dict[str, Any], named: str | None
) -> None:
    found = reserved.unanswered([waiting], DEFAULT_POLICY, NOW)
    assert [w.scheduler for w in found] == ([named] if named else [])
    if named:
        assert found[0].pods == ("team-a/train",)
        assert found[0].message == (
            f"1 GPU pod waits for scheduler {named!r}, which no scheduler answers (no "
            "scheduling event in over a minute): team-a/train"
        )


def test_waiting_pods_and_pods_the_extender_did_not_count_need_a_look() -> None:
    """Exit 1: each is found, even where every pod is confined."""
    confined = _stored(pod(container(gpu="4")), DEFAULT_POLICY)
    placed = {**confined, "spec": {**confined["spec"], "nodeName": "n1"}}
    placed["metadata"] = {**confined["metadata"], "annotations": {
        **confined["metadata"]["annotations"], "ALIYUN_COM_GPU_MEM_IDX": "0",
        "ALIYUN_COM_GPU_MEM_POD": "4"}}  # fmt: skip
    node = _node(mem="80", count="2")
    assert build_report(sort_objects([placed, node], "test"), DEFAULT_POLICY, now=NOW).clean
    del placed["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"]
    report = build_report(sort_objects([placed, node], "test"), DEFAULT_POLICY, now=NOW)
    assert (report.clean, report.unaccounted, report.pods[0].status) == (False, 1, "confined")
    old = {
        **confined,
        "metadata": {**confined["metadata"], "creationTimestamp": "2026-12-04T17:00:00Z"},
    }
    report = build_report(sort_objects([old], "test"), DEFAULT_POLICY, now=NOW)
    assert not report.clean
    assert [w.pods for w in report.unanswered] == [("team-a/train",)]


def test_what_each_pod_uses_is_the_node_agents_measure() -> None:
    """Reading the cluster, ``usage`` comes from the node agents (tests/apiserver/test_top.py
    reads a real one); a pod they report nothing for is not measured."""
    items = json.loads((HERE / "cluster.json").read_text())["items"]
    policy = parse_policy_text((HERE / "policy.yaml").read_text())
    bare = build_report(sort_objects(items, "cluster.json"), policy, now=NOW)
    first = bare.pods[0]
    usage = {(first.namespace, first.name): 3 * 2**30}
    measured = build_report(sort_objects(items, "cluster.json"), policy, now=NOW, usage=usage)
    used = {(p.namespace, p.name): p.used_bytes for p in measured.pods}
    assert used == {key: usage.get(key) for key in used}
    assert {p.used_bytes for p in bare.pods} == {None}
    (row,) = [line for line in as_table(measured).splitlines() if f" {first.name} " in line]
    assert " 3072 " in row
