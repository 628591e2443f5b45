"""The Helm chart: it lints, its objects are valid, and it is the kustomize install, no drift.

Helm is built from ``helm.sh/helm/v4`` by the test run (tests/gotools.py).
``helm template`` renders the chart for several value sets; every built-in
object validates against the Kubernetes 1.37 schemas (the custom ones, of
cert-manager and the Prometheus Operator, are checked by the real API
server in tests/apiserver/test_helm.py). With its defaults the chart makes
the objects ``kubectl kustomize manifests`` makes, object by object; the
only differences allowed are Helm's own labels, the name suffix of the
certificate Job, the Namespace (Helm's ``--create-namespace``), how the
policy's YAML is written and the CEL's line breaks. The policy part of
values.schema.json is made from the policy's key table, and docs/deploy.md's
values reference from values.schema.json: a test holds each equal.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import cel
import kubernetes_validate
import pytest
import yaml

from tests import gotools
from tests.helpers import container, pod, unavailable
from tests.test_manifests import K8S_VERSION, checkov, render  # noqa: F401 - checkov: a fixture
from webhook.decision.keys import json_schema
from webhook.decision.policy import Policy

ROOT = Path(__file__).parent.parent
CHART = ROOT / "charts" / "gpushare-webhook"
NAMESPACE = "gpushare-system"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"
CLUSTER_SCOPED_UNKNOWN_TO_KUSTOMIZE = {
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}
VALUE_SETS = {
    "defaults": [],
    "cert-manager": ["--set", "certificates.mode=cert-manager"],
    "hpa": ["--set", "autoscaling.enabled=true"],
    "monitoring": [
        "--set",
        "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,"
        "monitoring.dashboard.enabled=true",
    ],
    "report": ["--set", "report.enabled=true"],
    "pinned-and-narrow": [
        "--set",
        "image.repository=registry.example.com/gpushare-webhook,image.digest=sha256:"
        + "a" * 64
        + ",watchNodes.nodeSelector=gpushare=true,image.pullSecrets={regcred}",
    ],
    "no-extras": [
        "--set",
        "watchNodes.enabled=false,networkPolicy.enabled=false,podDisruptionBudget.enabled=false,"
        "criticalPodQuota.enabled=false,priorityClassName=",
    ],
}


@pytest.fixture(scope="session")
def helm() -> str:
    try:
        return str(gotools.tool("helm"))
    except gotools.Unavailable as error:
        unavailable("helm", error)


def template(helm: str, *args: str, release: str = "gpushare-webhook") -> list[dict[str, Any]]:
    done = subprocess.run(
        [helm, "template", release, str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_the_chart_lints_strictly(helm: str) -> None:
    done = subprocess.run(
        [helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_object_of_every_value_set_is_valid(helm: str, values: str) -> None:
    docs = template(helm, *VALUE_SETS[values])
    for doc in docs:
        if doc["apiVersion"].split("/")[0].endswith((".coreos.com", "cert-manager.io")):
            continue  # custom resources: checked by the real API server with their CRDs
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        if doc["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"):
            continue  # cluster-scoped or namespaced, the labels are what matter here
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "gpushare-webhook"


def comparable(doc: dict[str, Any], *, helm: bool) -> tuple[tuple[str, str], dict[str, Any]]:
    """The object as both installs must make it (see the module's docstring)."""
    doc = json.loads(json.dumps(doc))
    meta = doc["metadata"]
    if helm:
        labels = {k: v for k, v in meta.get("labels", {}).items() if k not in HELM_LABELS}
        meta.pop("labels", None)
        if labels:
            meta["labels"] = labels
    if doc["kind"] in CLUSTER_SCOPED_UNKNOWN_TO_KUSTOMIZE:
        meta.pop("namespace", None)  # kustomize sets it; the API server drops it on create
    if doc["kind"] == "Job":
        meta["name"] = re.sub(r"-certs-[a-z0-9]+$", "-certs-*", meta["name"])
    if doc["kind"] == "ConfigMap" and "policy.yaml" in doc.get("data", {}):
        doc["data"]["policy.yaml"] = yaml.safe_load(doc["data"]["policy.yaml"])
    for hook in doc.get("webhooks", []):
        for condition in hook.get("matchConditions", []):
            condition["expression"] = re.sub(r"\s+", "", condition["expression"])
    return (doc["kind"], meta["name"]), doc


@pytest.mark.parametrize(
    ("overlay", "values"),
    [("default", "defaults"), ("cert-manager", "cert-manager"), ("report", "report")],
)
def test_the_chart_makes_the_objects_kustomize_makes(helm: str, overlay: str, values: str) -> None:
    kustomized = dict(
        comparable(doc, helm=False) for doc in render(overlay) if doc["kind"] != "Namespace"
    )
    charted = dict(comparable(doc, helm=True) for doc in template(helm, *VALUE_SETS[values]))
    assert sorted(charted) == sorted(kustomized)
    for key, doc in kustomized.items():
        assert charted[key] == doc, key


def test_the_job_name_follows_the_image(helm: str) -> None:
    """A Job's pod template is immutable: each image gets a Job of its own (as in kustomize)."""

    def job(*args: str) -> str:
        (found,) = [d for d in template(helm, *args) if d["kind"] == "Job"]
        return str(found["metadata"]["name"])

    assert job() == job()
    assert job() != job("--set", "image.tag=0.2.0")


def test_the_schema_of_the_policy_is_made_from_its_key_table() -> None:
    path = CHART / "values.schema.json"
    schema = json.loads(path.read_text())
    made = {
        **json_schema(Policy),
        "description": schema["properties"]["policy"]["description"],
    }
    if UPDATE:
        schema["properties"]["policy"] = made
        path.write_text(json.dumps(schema, indent=2) + "\n")
    assert schema["properties"]["policy"] == made, "GOLDEN_UPDATE=1 rewrites it"
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) == set(schema["properties"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "policy.memoryUnit=GB"], "at '/policy/memoryUnit': value must be one of"),
        (["--set", "policy.gpuMemory=0"], "at '/policy/gpuMemory'"),
        (["--set", "policy.shim.libary=x.so"], "additional properties 'libary' not allowed"),
        (["--set", "polcy.gpuMemory=24"], "additional properties 'polcy' not allowed"),
        (["--set", "webhook.failurePolicy=Maybe"], "at '/webhook/failurePolicy'"),
        (["--set", "certificates.mode=vault"], "at '/certificates/mode'"),
        (["--set", "image.digest=latest"], "at '/image/digest'"),
        (["--set", "policy.namespaces.Team_A.enforcement=warn"], "'Team_A' does not match"),
    ],
    ids=["unit", "gpu-memory", "shim-key", "top-key", "failure-policy", "mode", "digest", "ns"],
)
def test_values_a_webhook_would_refuse_are_refused_at_install(
    helm: str, args: list[str], message: str
) -> None:
    done = subprocess.run(
        [helm, "template", "x", str(CHART), *args], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_the_match_condition_follows_the_policy_names(helm: str) -> None:
    names = "policy.resourceName=example.com/vram,policy.compute.resourceName=example.com/sm"
    docs = template(helm, "--set", names)
    (mwc,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    expression = mwc["webhooks"][0]["matchConditions"][0]["expression"]

    def sent(obj: dict[str, Any]) -> bool:
        return bool(cel.evaluate(expression, {"object": json.loads(json.dumps(obj))}))

    assert sent(pod(container(resources={"limits": {"example.com/vram": "4"}})))
    assert sent(pod(container(resources={"requests": {"example.com/sm": "20"}})))
    assert not sent(pod(container(gpu="4")))  # aliyun.com/gpu-mem is no longer the policy's
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert yaml.safe_load(configmap["data"]["policy.yaml"])["resourceName"] == "example.com/vram"


def values_reference() -> str:
    """docs/deploy.md's values table, made from values.schema.json (policy: its own reference)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = ["| value | default | what |", "|---|---|---|"]

    def walk(node: dict[str, Any], default: Any, path: str) -> None:
        if path == "policy":
            rows.append("| `policy` | see the policy reference | " + node["description"] + " |")
            return
        if node.get("type") == "object" and "properties" in node:
            for key, child in node["properties"].items():
                walk(child, (default or {}).get(key), f"{path}.{key}" if path else key)
            return
        shown = json.dumps(default) if default not in ("", None) else '""'
        rows.append(f"| `{path}` | `{shown}` | {node.get('description', '')} |")

    walk(schema, defaults, "")
    return "\n".join(rows) + "\n"


def test_the_values_reference_is_made_from_the_schema() -> None:
    reference = ROOT / "docs/deploy.md"
    text = reference.read_text()
    start = text.index("<!-- values reference: made from values.schema.json -->\n")
    start += len("<!-- values reference: made from values.schema.json -->\n")
    end = text.index("<!-- end of values reference -->", start)
    made = values_reference()
    if UPDATE:
        reference.write_text(text[:start] + made + text[end:])
    assert text[start:end] == made, "GOLDEN_UPDATE=1 rewrites it"


@pytest.mark.timeout(1200)  # the first run installs checkov into its venv
def test_the_chart_passes_checkov(helm: str, tmp_path: Path, checkov: str) -> None:  # noqa: F811
    everything = VALUE_SETS["monitoring"] + VALUE_SETS["report"] + VALUE_SETS["hpa"]
    (tmp_path / "chart.yaml").write_text(yaml.safe_dump_all(template(helm, *everything)))
    done = subprocess.run(
        [checkov, "-d", str(tmp_path), "--config-file", str(ROOT / ".checkov.yaml"), "-o", "json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    report = json.loads(done.stdout)
    failed = [
        f"{check['check_id']} {check['resource']}: {check['check_name']}"
        for check in report["results"].get("failed_checks", [])
    ]
    assert failed == [], "\n".join(failed)


@pytest.fixture(scope="session")
def helm3() -> str:
    try:
        return str(gotools.tool("helm3"))
    except gotools.Unavailable as error:
        unavailable("helm 3", error)


@pytest.mark.parametrize("values", ["defaults", "monitoring", "cert-manager"])
def test_helm_3_lints_and_renders_what_helm_4_does(helm: str, helm3: str, values: str) -> None:
    done = subprocess.run(
        [helm3, "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr

    def objects(binary: str) -> dict[tuple[str, str], Any]:  # in any order: each sorts its own
        return {
            (d["kind"], d["metadata"]["name"]): d for d in template(binary, *VALUE_SETS[values])
        }

    assert objects(helm3) == objects(helm)


def test_helm_3_renders_for_the_kubernetes_of_its_client() -> None:
    """The k8sVersion link flags follow the client-go its go.mod pins, as Helm's Makefile does."""
    pinned = re.search(
        r"k8s.io/client-go v0\.(\d+)\.", (gotools.TOOLS["helm3"][0] / "go.mod").read_text()
    )
    assert pinned is not None
    assert f"k8sVersionMinor={pinned[1]}" in gotools.LDFLAGS["helm3"]
