"""``gpushare-webhook report --from``: golden outputs from a list a real API server saved.

``tests/report/cluster.json`` is ``kubectl get pods,deployments,statefulsets,
daemonsets,jobs,cronjobs,replicasets,nodes -A -o json`` of the scene
tests/apiserver/test_report.py makes (a confined pod, one that slipped past
the webhook, one it would refuse, one warned, two Deployments, two GPU
nodes), judged by ``tests/report/policy.yaml``. The table and the JSON are
goldens (``GOLDEN_UPDATE=1`` rewrites them); malformed and partial input is
one line and exit 2.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import apply, container, pod
from webhook.cli import build_parser
from webhook.cli.report import cmd_report
from webhook.decision.nodes import NodeView
from webhook.decision.plan import plan
from webhook.decision.policy import DEFAULT_POLICY, Policy, parse_policy_text
from webhook.report.findings import OTHER_POLICY, build_report, judge_pod
from webhook.report.objects import sort_objects

HERE = Path(__file__).parent / "report"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"


def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parsed = build_parser().parse_args(["report", *args])
    code = cmd_report(parsed, io.StringIO(stdin), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("output", ["table", "json"])
def test_the_report_of_a_saved_list_is_its_golden(output: str) -> None:
    args = ["--from", str(HERE / "cluster.json"), "--policy", str(HERE / "policy.yaml")]
    code, out, _ = run(*args, "--output", output)
    assert code == 1  # drift and refusals: fit for a CronJob or CI
    golden = HERE / ("expected.txt" if output == "table" else "expected.json")
    if UPDATE:
        golden.write_text(out)
    assert out == golden.read_text()


def test_the_json_has_its_documented_shape() -> None:
    args = ["--from", str(HERE / "cluster.json"), "--policy", str(HERE / "policy.yaml")]
    _, out, _ = run(*args, "-o", "json")
    found = json.loads(out)
    assert list(found) == [
        "apiVersion", "kind", "unit", "clean", "summary", "pods", "workloads", "nodes", "notes",
    ]  # fmt: skip
    assert (found["apiVersion"], found["kind"], found["clean"]) == (
        "gpushare-webhook.io/v1",
        "Report",
        False,
    )
    assert found["summary"]["pods"] == {
        "confined": 2, "drifted": 1, "would-be-refused": 1, "warned": 1, "excluded": 0,
    }  # fmt: skip
    assert set(found["pods"][0]) == {
        "namespace", "name", "node", "status", "gpuMemory", "withoutLimit", "findings", "cause",
    }  # fmt: skip
    readme = (Path(__file__).parent.parent / "docs" / "report.md").read_text()
    for key in ("gpuMemory", "withoutLimit", "memoryPerGpu", "would-be-refused", "clean"):
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
    ],
    ids=["empty", "truncated", "not-an-object", "no-kind", "no-name", "no-namespace"],
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
    decision = plan(obj, policy, namespace="team-a")
    return apply(obj, list(decision.patch))


def test_a_pod_set_up_under_another_policy_has_drifted_and_says_what_differs() -> None:
    older = parse_policy_text("env: {memoryLimit: GPU_MEMORY_LIMIT}")
    found = judge_pod(_stored(pod(container(gpu="4")), older), DEFAULT_POLICY, NodeView())
    assert found is not None
    assert (found.status, found.cause) == ("drifted", OTHER_POLICY)
    assert "container 'main': no CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_LIMIT_0" in (
        found.findings
    )
    assert found.unlimited  # the shim reads no GPU_MEMORY_LIMIT
    same = judge_pod(_stored(pod(container(gpu="4")), DEFAULT_POLICY), DEFAULT_POLICY, NodeView())
    assert same is not None
    assert same.status == "confined"


def test_a_pod_set_up_before_the_shim_moved_has_drifted_not_been_refused() -> None:
    """Its own volume and mount, where the policy no longer puts them, are the webhook's."""
    older = parse_policy_text("shim: {hostPath: /opt/shim, mountPath: /opt/shim}")
    stored = _stored(pod(container(gpu="4")), older)
    found = judge_pod(stored, DEFAULT_POLICY, NodeView())
    assert found is not None
    assert (found.status, found.cause) == ("drifted", OTHER_POLICY)
    assert any("a name the webhook reserves" in finding for finding in found.findings)
    del stored["metadata"]["annotations"]  # not the webhook's doing: a pod's own clash
    assert judge_pod(stored, DEFAULT_POLICY, NodeView()).status == "would-be-refused"  # type: ignore[union-attr]


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
    report = build_report(objects, DEFAULT_POLICY)
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
