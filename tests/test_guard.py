"""The guard's objects: one generator, and every shipped copy equal to what it makes.

The guard's behaviour (what it passes and refuses) is tested against the
real API server in tests/apiserver/test_guard.py; here, that the kustomize
file, the chart and ``policy guard`` are the same objects for the same
policy, and that its bindings follow the policy's enforcement.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_chart import CHART, NAMESPACE, helm, template  # noqa: F401 - helm: a fixture
from webhook.cli.offline import dump_guard
from webhook.decision.claims import template_shape
from webhook.decision.guard import LOGIC, MATCH, bindings, guard
from webhook.decision.guardclaims import CLAIMED_MATCH, TEMPLATE_PATTERN
from webhook.decision.policy import parse_policy_text

ROOT = Path(__file__).parent.parent
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"
SHIPPED = ROOT / "manifests" / "base"
CHART_LOGIC = CHART / "files" / "guard.yaml"


def shipped_policy() -> str:
    config_map = yaml.safe_load((SHIPPED / "policy.yaml").read_text())
    return str(config_map["data"]["policy.yaml"])


def test_the_shipped_guard_is_made_from_the_shipped_policy(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(shipped_policy())
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "policy", "guard", str(tmp_path / "policy.yaml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    if UPDATE:
        (SHIPPED / "guard.yaml").write_text(done.stdout)
    assert (SHIPPED / "guard.yaml").read_text() == done.stdout, "GOLDEN_UPDATE=1 rewrites it"


def test_the_generator_makes_the_shipped_guard() -> None:
    """In process, so mutation testing sees it (the test above runs the command)."""
    made = guard(parse_policy_text(shipped_policy()))
    assert made == [d for d in yaml.safe_load_all((SHIPPED / "guard.yaml").read_text()) if d]


LITERALS = {
    # policy text: the variables the expressions read that it changes from the defaults
    "scheduler: ack\n": {"countFromLabel": "true"},
    "scheduler: ack\nmultiGpu: {countFrom: resource, memory: perDevice}\n": {
        "countFromResource": "true",
        "perDevice": "true",
    },
    "memoryUnit: MiB\ncompute: {default: 30}\nshim: {ldSoPreload: true, overrideFile: ''}\n": {
        "mibPerUnit": "1",
        "computeAlways": "true",
        "ldSoPreload": "true",
        "overrideFile": '""',
    },
    "shim: {mountPath: /opt/vgpu/, library: libx.so}\nenv: {memoryLimit: MEM}\n": {
        "mountPath": '"/opt/vgpu/"',
        "preload": '"/opt/vgpu/libx.so"',
        "memoryLimit": '"MEM"',
    },
    "resourceName: example.com/vram\nschedulerName: gpu-profile\n": {
        "resource": '"example.com/vram"',
        "schedulerName": '"gpu-profile"',
    },
    "scheduler: dra\n"
    "dra: {deviceClassName: hami-core-gpu.project-hami.io, driverSetsLimits: true}\n": {
        "countFromLabel": "true",
        "dra": "true",
        "deviceClass": '"hami-core-gpu.project-hami.io"',
        "driverSetsLimits": "true",
    },
}


def _literals(text: str) -> dict[str, str]:
    (policy, *_) = guard(parse_policy_text(text))
    names = [name for name, _ in LOGIC]
    return {
        v["name"]: v["expression"] for v in policy["spec"]["variables"] if v["name"] not in names
    }


@pytest.mark.parametrize(
    ("text", "changed"),
    LITERALS.items(),
    ids=[
        "ack-label",
        "ack-resource-per-device",
        "mib-compute-preload",
        "paths-names",
        "names",
        "dra-driver-sets-limits",
    ],
)
def test_the_policy_reaches_the_guard_as_literals(text: str, changed: dict[str, str]) -> None:
    defaults = _literals("")
    assert defaults["resource"] == '"aliyun.com/gpu-mem"'
    assert defaults["mibPerUnit"] == "1024"
    assert (defaults["dra"], defaults["deviceClass"]) == ("false", '"gpu.nvidia.com"')
    assert _literals(text) == {**defaults, **changed}
    (policy, *_) = guard(parse_policy_text(text))
    match = policy["spec"]["matchConditions"][0]["expression"]
    assert match == MATCH.replace("RESOURCE", _literals(text)["resource"])
    message = policy["spec"]["validations"][0]["messageExpression"]
    assert message.startswith('"gpushare-webhook guard: " + variables.problems.join')
    assert "check the MutatingWebhookConfiguration gpushare-webhook" in message


def test_the_charts_expressions_are_the_generators() -> None:
    text = CHART_LOGIC.read_text()
    made = {"match": MATCH, "variables": [{"name": n, "expression": e} for n, e in LOGIC]}
    if UPDATE:
        header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
        CHART_LOGIC.write_text(header + dump_guard([made]).split("\n", 5)[-1])
        text = CHART_LOGIC.read_text()
    assert yaml.safe_load(text) == made, "GOLDEN_UPDATE=1 rewrites it"


CHART_POLICIES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "ack-per-device-mib": {
        "scheduler": "ack",
        "memoryUnit": "MiB",
        "resourceName": "example.com/vram",
        "shim": {"mountPath": "/opt/vgpu/", "library": "libcap.so", "ldSoPreload": True},
        "multiGpu": {"countFrom": "resource", "memory": "perDevice"},
        "compute": {"default": "proportional"},
        "excludeNamespaces": ["monitoring"],
    },
    "warn-with-an-enforced-namespace": {
        "enforcement": "warn",
        "namespaces": {"prod": {"enforcement": "enforce"}, "lab": {"enforcement": "warn"}},
        "shim": {"overrideFile": ""},
    },
    "enforce-with-warned-namespaces": {
        "namespaces": {"b-team": {"enforcement": "warn"}, "a-team": {"enforcement": "warn"}},
    },
    "dra": {"scheduler": "dra"},
    "dra-driver-sets-limits": {
        "scheduler": "dra",
        "dra": {"deviceClassName": "hami-core-gpu.project-hami.io", "driverSetsLimits": True},
    },
}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and key in out else value
    return out


@pytest.mark.parametrize("name", CHART_POLICIES)
def test_the_chart_makes_the_generators_guard(
    helm: str,  # noqa: F811
    tmp_path: Path,
    name: str,
) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    policy = _merged(values["policy"], CHART_POLICIES[name])
    (tmp_path / "values.yaml").write_text(yaml.safe_dump({"policy": policy}))
    docs = template(
        helm, "-f", str(tmp_path / "values.yaml"), "--show-only", "templates/guard.yaml"
    )
    for doc in docs:
        doc["metadata"].pop("labels")
    made = guard(
        parse_policy_text(yaml.safe_dump(policy)),
        namespace=NAMESPACE,
        also_excluded=values["webhook"]["excludeNamespaces"],
    )
    assert docs == made


def test_the_chart_can_leave_the_guard_out(helm: str) -> None:  # noqa: F811
    kinds = {d["kind"] for d in template(helm, "--set", "guard.enabled=false")}
    assert "ValidatingAdmissionPolicy" in kinds  # the node agent's stays
    names = {d["metadata"]["name"] for d in template(helm, "--set", "guard.enabled=false")}
    assert not {n for n in names if n.endswith(("-guard", "-guard-warn"))}


BINDINGS = {
    # policy text: {binding: (actions, operator, namespaces)}; ids below
    "enforcement: enforce\n": {"gpushare-webhook-guard": (["Deny"], None, None)},
    "enforcement: warn\n": {"gpushare-webhook-guard-warn": (["Warn", "Audit"], None, None)},
    "namespaces: {lab: {enforcement: warn}}\n": {
        "gpushare-webhook-guard": (["Deny"], "NotIn", ["lab"]),
        "gpushare-webhook-guard-warn": (["Warn", "Audit"], "In", ["lab"]),
    },
    "enforcement: warn\nnamespaces: {prod: {enforcement: enforce}}\n": {
        "gpushare-webhook-guard-warn": (["Warn", "Audit"], "NotIn", ["prod"]),
        "gpushare-webhook-guard": (["Deny"], "In", ["prod"]),
    },
}


# NB: plain ids: mutation testing names each test on a command line.
@pytest.mark.parametrize(
    ("text", "expected"),
    BINDINGS.items(),
    ids=["enforce", "warn", "enforce-but-a-warned-namespace", "warn-but-an-enforced-namespace"],
)
def test_the_guard_denies_where_the_webhook_refuses_and_warns_where_it_warns(
    text: str, expected: dict[str, tuple[list[str], str | None, list[str] | None]]
) -> None:
    found = {}
    for binding in bindings(parse_policy_text(text), webhook="gpushare-webhook"):
        spec = binding["spec"]
        assert spec["policyName"] == "gpushare-webhook-guard"
        selector = spec.get("matchResources", {}).get("namespaceSelector", {})
        # A binding for every namespace has no selector; one that has one selects by name.
        (expression,) = selector.get("matchExpressions", [{"key": "kubernetes.io/metadata.name"}])
        assert expression["key"] == "kubernetes.io/metadata.name"
        found[binding["metadata"]["name"]] = (
            spec["validationActions"],
            expression.get("operator"),
            expression.get("values"),
        )
    assert found == expected


def test_the_guard_skips_what_the_webhook_skips() -> None:
    policy_text = "excludeNamespaces: [kube-system, batch]\n"
    (policy, *_) = guard(parse_policy_text(policy_text), also_excluded=["monitoring"])
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert selector == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["batch", "gpushare-system", "kube-system", "monitoring"],
        },
        {"key": "gpushare-webhook.io/injection", "operator": "NotIn", "values": ["disabled"]},
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent.yaml"], "/nonexistent.yaml"),
        (["--namespace"], "expected one argument"),
    ],
)
def test_policy_guard_with_bad_input_says_one_line(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "policy", "guard", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr


TEMPLATE_NAMES = {
    # a template's name: whether it is one of the webhook's (claims.template_shape reads it)
    "gpushare-4096mi.gpu.nvidia.com": True,
    "gpushare-8192mi-x2.gpu.nvidia.com": True,
    "gpushare-4096mi-c25.hami-core-gpu.project-hami.io": True,
    "gpushare-2048mi-x4-c0.gpu.nvidia.com": True,
    "gpushare-4096mi-x2-c30.gpu-x3.example.com": True,  # a class may read like a shape
    "gpushare-4096mi": False,  # no DeviceClass
    "gpushare-4096.gpu.nvidia.com": False,  # no unit
    "gpushare-4gi.gpu.nvidia.com": False,
    "gpushare-4096mi-c25-x2.gpu.nvidia.com": False,  # the webhook writes GPUs first
    "team-4096mi.gpu.nvidia.com": False,
    "my-gpushare-4096mi.gpu.nvidia.com": False,
}


@pytest.mark.parametrize("name", TEMPLATE_NAMES, ids=list(TEMPLATE_NAMES))
def test_the_guard_takes_a_template_for_the_webhooks_as_claims_reads_it(name: str) -> None:
    """The guard's pattern (RE2, a subset Python's re reads alike here) and its parse of
    the name's head agree with claims.template_shape on every name of the table."""
    shape = template_shape(name)
    assert (shape is not None) == TEMPLATE_NAMES[name]
    assert (re.search(TEMPLATE_PATTERN, name) is not None) == TEMPLATE_NAMES[name]
    if shape is not None:
        head, _, device_class = name.partition(".")
        mib, gpus, compute, shaped_class = shape
        # What the CEL of guardclaims reads from the head, step for step.
        assert int(head.split("-")[1].split("mi")[0]) == mib
        assert (int(head.split("-x")[1].split("-")[0]) if "-x" in head else 1) == gpus
        assert (int(head.split("-c")[1]) if "-c" in head else None) == compute
        assert device_class == shaped_class


def test_under_dra_the_guard_reads_the_pods_that_name_a_webhook_claim() -> None:
    (policy, *_) = guard(parse_policy_text("scheduler: dra\n"))
    match = policy["spec"]["matchConditions"][0]["expression"]
    assert match.endswith(" || " + CLAIMED_MATCH)
    assert "r.name.startsWith('gpushare-')" in CLAIMED_MATCH
    names = [v["name"] for v in policy["spec"]["variables"]]
    # A variable reads only those before it.
    assert names.index("draOk") < names.index("ok")
    assert names.index("draProblems") < names.index("problems")
