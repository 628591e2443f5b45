"""The offline CLI: mutate over pods and workloads, exit codes, outputs; policy and certs."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import container, env_of, pod
from webhook.cli import build_parser, main
from webhook.cli.args import SERVE_DEFAULTS
from webhook.cli.offline import cmd_mutate
from webhook.decision import claim_template, parse_policy_text
from webhook.errors import InputError
from webhook.serving.server import ServeOptions


def run_mutate(text: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parsed = build_parser().parse_args(["mutate", "-", *args])
    code = cmd_mutate(parsed, io.StringIO(text), out, err)
    return code, out.getvalue(), err.getvalue()


def template(kind: str, api: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    tpl = {"metadata": {"labels": {"app": "x"}}, "spec": pod_spec}
    spec: dict[str, Any] = {"template": tpl}
    if kind == "CronJob":
        spec = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": tpl}}}
    return {"apiVersion": api, "kind": kind, "metadata": {"name": kind.lower()}, "spec": spec}


GPU_SPEC = pod(container(gpu="2"))["spec"]
WORKLOADS = [
    ("Deployment", "apps/v1", ("spec", "template")),
    ("StatefulSet", "apps/v1", ("spec", "template")),
    ("DaemonSet", "apps/v1", ("spec", "template")),
    ("ReplicaSet", "apps/v1", ("spec", "template")),
    ("Job", "batch/v1", ("spec", "template")),
    ("CronJob", "batch/v1", ("spec", "jobTemplate", "spec", "template")),
]


@pytest.mark.parametrize(("kind", "api", "path"), WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_workload_templates_are_mutated(kind: str, api: str, path: tuple[str, ...]) -> None:
    code, out, err = run_mutate(yaml.safe_dump(template(kind, api, GPU_SPEC)))
    assert code == 0, err
    doc = yaml.safe_load(out)
    for key in path:
        doc = doc[key]
    env = env_of(doc["spec"]["containers"][0])
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "2048m"
    assert doc["spec"]["schedulerName"] == "default-scheduler"
    assert "gpushare-webhook.io/status" in doc["metadata"]["annotations"]


# ACK's own multi-GPU sample Job, as its documentation gives it.
ACK_MULTI_GPU_JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: tensorflow-mnist-multigpu}
spec:
  parallelism: 1
  template:
    metadata:
      labels:
        app: tensorflow-mnist-multigpu
        aliyun.com/gpu-count: "2"
    spec:
      containers:
      - name: tensorflow-mnist-multigpu
        image: registry.cn-beijing.aliyuncs.com/ai-samples/gpushare-sample:tensorflow-1.5
        resources: {limits: {aliyun.com/gpu-mem: 8}}
      restartPolicy: Never
"""


def test_the_gpu_count_label_of_a_pod_template_splits_the_memory(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("scheduler: ack\n")
    code, out, err = run_mutate(ACK_MULTI_GPU_JOB, "--policy", str(policy))
    assert code == 0, err
    env = yaml.safe_load(out)["spec"]["template"]["spec"]["containers"][0]["env"]
    limits = {e["name"]: e["value"] for e in env if "MEMORY_LIMIT" in e["name"]}
    assert limits == {
        "CUDA_DEVICE_MEMORY_LIMIT": "4096m",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "4096m",
    }


def test_many_documents_json_is_a_list_and_rejected_ones_are_left_out() -> None:
    docs = [
        pod(container(gpu="1")),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "b"}},
        {**pod(container(gpu="0.5")), "metadata": {"name": "half"}},
    ]
    code, out, err = run_mutate(yaml.safe_dump_all(docs), "-o", "json")
    assert code == 1
    listing = json.loads(out)
    assert listing["kind"] == "List"
    assert [item["kind"] for item in listing["items"]] == ["Pod", "ConfigMap"]
    assert listing["items"][1] == docs[1]
    assert "rejected: document 3 (Pod/half)" in err
    assert "'0.5'" in err


def test_one_document_json_is_the_object() -> None:
    code, out, _ = run_mutate(json.dumps(pod(container(gpu="1"))), "-o", "json")
    assert code == 0
    assert json.loads(out)["kind"] == "Pod"


def test_patch_output_is_the_webhook_patch() -> None:
    code, out, _ = run_mutate(yaml.safe_dump(pod(container(gpu="1"))), "-o", "patch")
    assert code == 0
    ops = json.loads(out)
    assert {op["path"] for op in ops} >= {"/spec/schedulerName", "/spec/containers/0/env"}


def test_patch_output_tells_refused_from_unchanged() -> None:
    documents = [pod(container(gpu="99")), pod(container()), pod(container(gpu="1"))]
    code, out, err = run_mutate(yaml.safe_dump_all(documents), "-o", "patch")
    assert code == 1
    refused, unchanged, mutated = json.loads(out)
    assert refused is None
    assert unchanged == []
    assert mutated
    assert err.count("rejected: document 1") == 1


def test_every_problem_of_a_pod_is_a_line_of_its_own() -> None:
    bad = pod(container("a", gpu="2.5"), container("b", gpu="99"), nodeName="n1")
    code, out, err = run_mutate(yaml.safe_dump(bad), "-o", "patch")
    assert code == 1
    assert json.loads(out) is None
    lines = err.splitlines()
    assert len(lines) == 3
    assert all(line.startswith("rejected: document 1 (Pod/") for line in lines)
    assert [line.split(": ", 2)[2].split(" ", 2)[:2] for line in lines] == [
        ["spec.nodeName", "is"],
        ["container", "'a'"],
        ["container", "'b'"],
    ]


def test_custom_resource_mentioning_gpu_memory_passes_with_a_warning() -> None:
    cr = {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "metadata": {"name": "pj"},
        "spec": {"template": {"spec": GPU_SPEC}},
    }
    code, out, err = run_mutate(yaml.safe_dump(cr))
    assert code == 0
    assert yaml.safe_load(out) == cr
    assert "warning: document 1 (Trainer/pj) mentions aliyun.com/gpu-mem" in err


TEMPLATE = {"metadata": {"labels": {"app": "x"}}, "spec": GPU_SPEC}
# Published samples and the training-job kinds GPU users run: (document, pod template paths).
TEMPLATED = [
    (
        {"apiVersion": "extensions/v1beta1", "kind": "Deployment", "spec": {"template": TEMPLATE}},
        ["spec.template"],
    ),
    (
        {"apiVersion": "apps/v1beta1", "kind": "StatefulSet", "spec": {"template": TEMPLATE}},
        ["spec.template"],
    ),
    (
        {"apiVersion": "apps/v1beta2", "kind": "DaemonSet", "spec": {"template": TEMPLATE}},
        ["spec.template"],
    ),
    (
        {
            "apiVersion": "batch/v1beta1",
            "kind": "CronJob",
            "spec": {"jobTemplate": {"spec": {"template": TEMPLATE}}},
        },
        ["spec.jobTemplate.spec.template"],
    ),
    (
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": TEMPLATE},
                    "Worker": {"replicas": 2, "template": TEMPLATE},
                }
            },
        },
        ["spec.pytorchReplicaSpecs.Master.template", "spec.pytorchReplicaSpecs.Worker.template"],
    ),
    (
        {
            "apiVersion": "kubeflow.org/v2beta1",
            "kind": "MPIJob",
            "spec": {"mpiReplicaSpecs": {"Worker": {"template": TEMPLATE}}},
        },
        ["spec.mpiReplicaSpecs.Worker.template"],
    ),
    (
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "spec": {
                "replicatedJobs": [
                    {"name": "workers", "template": {"spec": {"template": TEMPLATE}}}
                ]
            },
        },
        ["spec.replicatedJobs.0.template.spec.template"],
    ),
    (
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "spec": {"leaderWorkerTemplate": {"workerTemplate": TEMPLATE}},
        },
        ["spec.leaderWorkerTemplate.workerTemplate"],
    ),
    (
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "spec": {
                "headGroupSpec": {"template": TEMPLATE},
                "workerGroupSpecs": [{"groupName": "gpu", "template": TEMPLATE}],
            },
        },
        ["spec.headGroupSpec.template", "spec.workerGroupSpecs.0.template"],
    ),
]


@pytest.mark.parametrize(
    ("document", "paths"),
    TEMPLATED,
    ids=[f"{doc['apiVersion']}-{doc['kind']}" for doc, _ in TEMPLATED],
)
def test_every_pod_template_of_a_known_kind_is_previewed(
    document: dict[str, Any], paths: list[str]
) -> None:
    document = {**document, "metadata": {"name": "w"}}
    code, out, err = run_mutate(yaml.safe_dump(document))
    assert code == 0, err
    done = yaml.safe_load(out)
    for path in paths:
        node: Any = done
        for key in path.split("."):
            node = node[int(key)] if isinstance(node, list) else node[key]
        env = env_of(node["spec"]["containers"][0])
        assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "2048m", path
    removed = document["apiVersion"] in {"extensions/v1beta1", "apps/v1beta1", "apps/v1beta2"}
    if removed or document["apiVersion"] == "batch/v1beta1":
        assert f"{document['apiVersion']} was removed in Kubernetes 1." in err
    else:
        assert "warning" not in err


def test_a_refused_template_is_named_by_its_path() -> None:
    big = {"metadata": {}, "spec": pod(container(gpu="99"))["spec"]}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pj"},
        "spec": {
            "pytorchReplicaSpecs": {"Master": {"template": TEMPLATE}, "Worker": {"template": big}}
        },
    }
    code, _, err = run_mutate(yaml.safe_dump(job))
    assert code == 1
    assert "rejected: document 1 (PyTorchJob/pj) spec.pytorchReplicaSpecs.Worker.template:" in err
    assert "Master" not in err


def test_v1_list_input_is_expanded() -> None:
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [pod(container(gpu="1")), pod(container("web"))],
    }
    code, out, _ = run_mutate(yaml.safe_dump(listing), "-o", "json")
    assert code == 0
    assert len(json.loads(out)["items"]) == 2


@pytest.mark.parametrize("text", ["", "a: [unclosed", "\t- bad"])
def test_unreadable_input_exits_2(
    text: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert main(["mutate", "-"]) == 2
    assert "gpushare-webhook:" in capsys.readouterr().err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutate", "/nonexistent.yaml"]) == 2
    assert "cannot read /nonexistent.yaml" in capsys.readouterr().err


def test_mutate_with_a_policy_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("memoryUnit: MiB\ngpuMemory: 40960\n")
    source = tmp_path / "pod.yaml"
    source.write_text(yaml.safe_dump(pod(container(gpu="5000"))))
    assert main(["mutate", str(source), "--policy", str(policy), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spec"]["containers"][0]["env"][0]["value"] == "5000m"


@pytest.mark.parametrize(
    ("args", "changed"),
    [((), True), (("-n", "kube-system"), False), (("--namespace", "team-a"), True)],
    ids=["no-namespace", "excluded", "included"],
)
def test_namespace_flag_stands_in_for_an_unnamed_namespace(
    args: tuple[str, ...], changed: bool
) -> None:
    document = pod(container(gpu="2"))
    del document["metadata"]["namespace"]
    code, out, _ = run_mutate(yaml.safe_dump(document), "-o", "patch", *args)
    assert code == 0
    assert bool(json.loads(out)) is changed


def test_a_named_namespace_wins_over_the_flag() -> None:
    document = pod(container(gpu="2"))  # in team-a
    code, out, _ = run_mutate(yaml.safe_dump(document), "-o", "patch", "-n", "kube-system")
    assert code == 0
    assert json.loads(out)


def test_policy_check_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("gpuMemory: 24\n")
    bad.write_text("gpuMemroy: 24\n")
    assert main(["policy", "check", str(good)]) == 0
    assert main(["policy", "check", str(bad)]) == 2
    assert "'gpuMemroy' is not known" in capsys.readouterr().err
    assert main(["policy", "show", str(good)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["gpuMemory"] == 24
    assert shown["scheduler"] == "gpushare-extender"
    assert shown["schedulerName"] == "default-scheduler"


def test_console_script_is_installed() -> None:
    done = subprocess.run(
        ["gpushare-webhook", "--version"], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0
    assert done.stdout.startswith("gpushare-webhook ")


def test_serve_help_shows_the_defaults_serve_uses() -> None:
    options = ServeOptions(bind="x:1", cert=Path("c"), key=Path("k"))
    assert {
        "workers": options.workers,
        "threads": options.threads,
        "read_timeout": options.read_timeout,
        "idle_timeout": options.keepalive,
        "drain": options.drain,
    } == SERVE_DEFAULTS
    text = " ".join(
        build_parser()._subparsers._group_actions[0].choices["serve"].format_help().split()
    )
    for default in [
        "(default: 2)",
        "(default: 4)",
        "(default: 10)",
        "(default: 120)",
        "(default: 5)",
    ]:
        assert default in text


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, Any]:
    """Every leaf command of the CLI ("serve", "certs create", ...) and its parser."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_commands(sub, f"{prefix}{name} "))
    return found or {prefix.strip(): parser}


def test_the_command_summary_lists_every_option() -> None:
    reference = (Path(__file__).parent.parent / "docs/cli.md").read_text()
    summary = reference.split("# Command line", 1)[1].split("```", 2)[1]
    for command, parser in _commands(build_parser()).items():
        # The command's own lines: from its name to the next command's.
        lines = summary.split(f"gpushare-webhook {command}", 1)[1].split("gpushare-webhook ", 1)[0]
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or "-h" in action.option_strings:
                continue
            if action.option_strings:
                named = action.option_strings[0]
                shown = any(option in lines for option in action.option_strings)
            else:  # a positional, shown by its metavar or name in capitals
                named = action.metavar or action.dest.upper()
                shown = named in lines
            assert shown, f"docs/cli.md's command summary lacks {named} of {command}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: Pod\nmetadata: {name: x\n",
            "standard input is not valid YAML or JSON: line 3, column 1: expected ',' or '}', "
            "but got '<stream end>' (while parsing a flow mapping)",
        ),
        ("---\n", "standard input holds no documents"),
        (
            # PyYAML would keep the second name; the API server refuses both.
            '{"kind": "Pod", "metadata": {"name": "a", "name": "b"}}',
            "standard input is not valid YAML or JSON: line 1, column 43: "
            "key 'name' appears twice in one mapping",
        ),
    ],
)
def test_unreadable_input_is_one_line_naming_where(text: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        run_mutate(text)
    assert str(caught.value) == message


def test_a_yaml_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("spec:\n  - a\n  b: c\n")
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "mutate", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"gpushare-webhook: {path} is not valid YAML or JSON: line 3,")
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ({"kind": "Deployment"}, "has no apiVersion, so no cluster would take it"),
        ({"apiVersion": "apps/v1"}, "has no kind, so no cluster would take it"),
        ({}, "has no apiVersion and kind"),
        (
            {"apiVersion": "example.com/v1", "kind": "Trainer"},
            "example.com/v1 Trainer is not a kind",
        ),
    ],
)
def test_a_document_the_preview_cannot_place_says_why(document: dict[str, Any], said: str) -> None:
    document = {**document, "spec": GPU_SPEC}
    code, _, err = run_mutate(json.dumps(document))
    assert code == 0
    assert said in err
    assert "None" not in err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("vm\n", "document 1 is a YAML string, not a Kubernetes object"),
        ("- a\n- b\n", "document 1 is a YAML list, not a Kubernetes object"),
        ("foo: bar\n", "has no apiVersion and kind, so no cluster would take it; left as it is"),
        ("---\n---\nkind: Service\napiVersion: v1\n", ""),
    ],
    ids=["a string", "a list", "a mapping of no kind", "empty documents and a Service"],
)
def test_a_document_that_is_no_object_is_passed_with_a_note(text: str, said: str) -> None:
    code, out, err = run_mutate(text)
    assert code == 0
    assert out.strip()  # passed through, as kubectl would be handed it
    assert (said in err and len(err.splitlines()) == 1) if said else err == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_mutate_says_it_waits_for_a_terminal() -> None:
    err = io.StringIO()
    parsed = build_parser().parse_args(["mutate"])
    cmd_mutate(parsed, Terminal(json.dumps(pod(container()))), io.StringIO(), err)
    assert err.getvalue().startswith("reading YAML from standard input; end it with Ctrl-D")
    piped = run_mutate(json.dumps(pod(container())))[2]
    assert "reading YAML" not in piped


def _read_until(fd: int, deadline: float, until: bytes = b"") -> bytes:
    """What the terminal shows until ``until`` appears, it closes, or the deadline passes."""
    seen = b""
    while not until or until not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        try:
            chunk = os.read(fd, 1024)
        except OSError:  # the terminal closes with the child
            break
        if not chunk:
            break
        seen += chunk
    return seen


def test_ctrl_c_exits_quietly() -> None:
    """On a terminal, as a user presses it while mutate waits for its input."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        # NB: a shell starts background jobs with SIGINT ignored, and an ignored
        # signal stays ignored across exec: restore the default a user's terminal has.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(sys.executable, [sys.executable, "-m", "webhook", "mutate"])
    try:
        deadline = time.monotonic() + 30
        seen = _read_until(fd, deadline, b"Ctrl-D")
        assert b"Ctrl-D" in seen, seen
        os.kill(pid, signal.SIGINT)
        seen += _read_until(fd, deadline)
        status = _wait(pid, deadline)
    finally:
        os.close(fd)
        with contextlib.suppress(ChildProcessError):  # already reaped when it exited
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 130
    assert b"Traceback" not in seen


def _wait(pid: int, deadline: float) -> int:
    """The child's wait status, or a failure once the deadline passes."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    pytest.fail("mutate did not exit on SIGINT")


def test_mutate_under_warn_admits_and_says_what_would_be_refused(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("namespaces: {team-a: {enforcement: warn}}\n")
    text = yaml.safe_dump(pod(container(gpu="40"), container("ok", gpu="4")))
    code, out, err = run_mutate(text, "--policy", str(policy))
    assert code == 0
    lines = err.splitlines()
    assert lines[0] == (
        "warned: document 1 (Pod/train): container 'main' asks 40 GiB of aliyun.com/gpu-mem "
        "per GPU, but the largest GPU has 16 GiB (policy gpuMemory): the pod could never be "
        "scheduled; ask at most 16"
    )
    # The other line is the admission warning any pod with two GPU containers gets.
    assert [line.split(": ", 2)[2][:28] for line in lines[1:]] == ["containers 'main', 'ok' each"]
    mutated = yaml.safe_load(out)
    assert mutated["spec"]["containers"][1]["env"][0]["name"] == "CUDA_DEVICE_MEMORY_LIMIT"
    # The same pod in a namespace the policy does not name is refused.
    code, _, err = run_mutate(text, "--policy", str(policy), "-n", "team-b")
    assert code == 0  # the document names team-a: that is where it goes
    other = yaml.safe_dump(pod(container(gpu="40"), container("ok", gpu="4")) | {"metadata": {}})
    code, _, err = run_mutate(other, "--policy", str(policy), "-n", "team-b")
    assert code == 1
    assert err.startswith("rejected: ")


def test_the_readme_tour_is_what_mutate_prints() -> None:
    """README's one-minute tour shows a pod and what admission makes of it: the same data."""
    text = (Path(__file__).parent.parent / "README.md").read_text()
    tour = text[text.index("## A one-minute tour") :]
    given, admitted = tour.split("```yaml\n")[1:3]
    code, out, err = run_mutate(given.split("```")[0])
    assert code == 0, err
    assert yaml.safe_load(out) == yaml.safe_load(admitted.split("```")[0])


DRA = "scheduler: dra\n"
PREVIEWED_CLAIMS = {
    # id: (policy, documents, -n, the claim lines on stderr, (namespace, template) printed)
    "a-pod": (
        DRA,
        [pod(container(gpu="4"))],
        "",
        ["claim: document 1 (Pod/train): gpushare-main from gpushare-4096mi.gpu.nvidia.com"],
        [("team-a", "gpushare-4096mi.gpu.nvidia.com")],
    ),
    "each-container-its-own-one-template-per-size": (
        DRA,
        [pod(container(gpu="4"), container("side", gpu="4"), init=[container("warm", gpu="2")])],
        "",
        [  # in the pod's order of claims: init containers first
            "claim: document 1 (Pod/train): gpushare-warm from gpushare-2048mi.gpu.nvidia.com",
            "claim: document 1 (Pod/train): gpushare-main from gpushare-4096mi.gpu.nvidia.com",
            "claim: document 1 (Pod/train): gpushare-side from gpushare-4096mi.gpu.nvidia.com",
        ],
        [
            ("team-a", "gpushare-2048mi.gpu.nvidia.com"),
            ("team-a", "gpushare-4096mi.gpu.nvidia.com"),
        ],
    ),
    "a-workload-in-the-flags-namespace": (
        "scheduler: dra\ndra: {deviceClassName: hami-core-gpu.project-hami.io, "
        "computeCapacity: cores}\n",
        [template("Deployment", "apps/v1", pod(container(gpu="2"))["spec"])],
        "lab",
        [
            "claim: document 1 (Deployment/deployment): gpushare-main from "
            "gpushare-2048mi-c0.hami-core-gpu.project-hami.io"
        ],
        [("lab", "gpushare-2048mi-c0.hami-core-gpu.project-hami.io")],
    ),
    "two-namespaces-two-templates": (
        DRA,
        [pod(container(gpu="4")), pod(container(gpu="4"), namespace="team-b")],
        "",
        [
            "claim: document 1 (Pod/train): gpushare-main from gpushare-4096mi.gpu.nvidia.com",
            "claim: document 2 (Pod/train): gpushare-main from gpushare-4096mi.gpu.nvidia.com",
        ],
        [
            ("team-a", "gpushare-4096mi.gpu.nvidia.com"),
            ("team-b", "gpushare-4096mi.gpu.nvidia.com"),
        ],
    ),
    "not-under-the-extender": (DRA.replace("dra", "gpushare-extender"), [pod()], "", [], []),
    "a-refused-pod-names-none": (DRA, [pod(container(gpu="0.5"))], "", [], []),
}


@pytest.mark.parametrize("case", PREVIEWED_CLAIMS, ids=list(PREVIEWED_CLAIMS))
def test_under_dra_mutate_shows_the_claims_and_the_templates_the_cluster_makes(
    tmp_path: Path, case: str
) -> None:
    text, documents, namespace, lines, made = PREVIEWED_CLAIMS[case]
    (tmp_path / "policy.yaml").write_text(text)
    source = yaml.safe_dump_all(documents)
    args = ("--policy", str(tmp_path / "policy.yaml"), "-n", namespace)
    _, _, err = run_mutate(source, *args)
    said = [line.split(", made in", 1)[0] for line in err.splitlines() if line.startswith("claim:")]
    assert said == [line.replace(" from ", " from ResourceClaimTemplate ") for line in lines]
    _, out, err = run_mutate(source, *args, "-o", "templates")
    printed = [doc for doc in yaml.safe_load_all(out) if doc]
    assert [(d["metadata"]["namespace"], d["metadata"]["name"]) for d in printed] == made
    # Nothing to print is said, in one line: the scheduler gives no claims, or no pod asks.
    notes = [line for line in err.splitlines() if line.startswith("note: no ResourceClaimTemplate")]
    assert len(notes) == (0 if made else 1)
    assert ("only dra does" in err) is ("gpushare-extender" in text)
    policy = parse_policy_text(text)
    for body in printed:
        # The body the cluster side makes from the name, in the pod's namespace.
        expected = claim_template(body["metadata"]["name"], policy)
        assert expected is not None
        expected["metadata"]["namespace"] = body["metadata"]["namespace"]
        assert body == expected
