"""The guard against the real API server: it passes what the webhook sets up, refuses the rest.

The guard (manifests/base/guard.yaml, ``gpushare-webhook policy guard``) is
applied here for the policy the installed webhook serves, and removed after.
Each way of bypassing the webhook is done for real: its configuration
edited to call it for no create, ``failurePolicy: Ignore`` with the webhook stopped, and a second
webhook (a tiny one: no real webhook strips env on demand) that removes
the shim's variables after ours, reinvoked after our reinvocation.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.apiserver.helpers import (
    apply_server_side,
    create_namespace,
    delete_namespaces,
    gpu_container,
    pod_manifest,
    refusal,
    register_webhook,
    tiny_webhook,
    wait_for_service_account,
)
from tests.controlplane.install import (
    GUARD,
    NS,
    ROOT,
    Installed,
    service_account_kubeconfig,
    webhook_cli,
)
from tests.helpers import apply, eventually
from tests.test_rules import CASES, _pod, answer_of
from webhook import tls
from webhook.decision.policy import parse_policy_text

TEAM, OPTED_OUT, WARNED = "guard-team", "guard-opted-out", "guard-warned"
GOLDEN = Path(__file__).parent.parent / "golden"
GUARDED = "gpushare-webhook guard: "


def _made(policy: Path) -> list[dict[str, Any]]:
    """``gpushare-webhook policy guard POLICY``: the guard's objects."""
    done = webhook_cli("policy", "guard", str(policy))
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _guard(installed: Installed, *extra: str) -> list[dict[str, Any]]:
    """The guard for the policy the webhook serves (plus ``extra`` YAML lines), as applied."""
    served = Path(installed.args[installed.args.index("--policy") + 1]).read_text()
    policy = Path(installed.folder) / "guard-policy.yaml"
    policy.write_text(served + "".join(line + "\n" for line in extra))
    return _made(policy)


def _apply(installed: Installed, objects: list[dict[str, Any]]) -> None:
    apply_server_side(installed.plane, yaml.safe_dump_all(objects))


def _remove(installed: Installed) -> None:
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        names = installed.plane.kubectl("get", kind, "-o", "name").stdout.split()
        for name in names:
            if name.split("/", 1)[1].startswith(GUARD):
                installed.plane.kubectl("delete", name, "--wait=true")


def _dry_run(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> str | None:
    """The API server's refusal of the pod's create (dry run: nothing stored), or None.

    A body the client will not send (a malformed pod of a test's table) is refused
    before the API server: that says so.
    """
    try:
        client.CoreV1Api(api).create_namespaced_pod(namespace, body, dry_run="All")
    except ApiException as error:
        return str(json.loads(error.body)["message"])
    except pydantic.ValidationError as error:
        return f"not sent: {error.error_count()} fields the API's schema refuses"
    return None


@pytest.fixture(scope="module")
def guarded(installed: Installed, pki: tls.Issued) -> Iterator[Installed]:
    try:
        for namespace, labels in (
            (TEAM, None),
            (OPTED_OUT, {"gpushare-webhook.io/injection": "disabled"}),
            (WARNED, None),
        ):
            create_namespace(installed.api, namespace, labels)
            wait_for_service_account(installed.api, namespace)
        _apply(installed, _guard(installed, "namespaces:", f"  {WARNED}: {{enforcement: warn}}"))
        # The API server enforces a policy once its informer has it: wait until a
        # pod stripped after the webhook is refused by it.
        with stripping(installed, pki):
            eventually(lambda: GUARDED in (_stripped(installed) or ""), timeout=30)
        yield installed
    finally:
        _remove(installed)
        delete_namespaces(installed.api, TEAM, OPTED_OUT, WARNED)


def _strip(request: dict[str, Any]) -> dict[str, Any]:
    """A webhook's answer that removes the first container's env, if it has one."""
    answer: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    if request["object"]["spec"]["containers"][0].get("env"):
        patch = [{"op": "remove", "path": "/spec/containers/0/env"}]
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return answer


@contextlib.contextmanager
def stripping(installed: Installed, pki: tls.Issued) -> Iterator[None]:
    """A webhook in TEAM that strips the env ours set: called after ours (configurations
    run in name order), and again after ours is reinvoked, so its strip is what
    reaches validation."""
    with tiny_webhook(pki.cert, pki.key, _strip) as port:
        register_webhook(
            installed.plane,
            "zz-strip-env",
            port=port,
            ca_pem=pki.ca.read_bytes(),
            namespace=TEAM,
            reinvocation="IfNeeded",
        )
        try:
            yield
        finally:
            installed.plane.kubectl("delete", "mutatingwebhookconfiguration", "zz-strip-env")


def _stripped(installed: Installed) -> str | None:
    return _dry_run(installed.api, TEAM, pod_manifest("stripped", gpu_container()))


def _goldens() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for case in sorted(GOLDEN.iterdir()):
        if not case.is_dir() or (case / "policy.yaml").exists():
            continue
        request = json.loads((case / "request.json").read_text())["request"]
        if request.get("operation") != "CREATE" or request.get("kind", {}).get("kind") != "Pod":
            continue
        pod = request["object"]
        pod["metadata"] = {**pod.get("metadata", {}), "name": case.name}
        pod["metadata"].pop("namespace", None)
        pod["metadata"].pop("generateName", None)
        found.append((case.name, pod))
    return found


def test_every_golden_pod_the_webhook_admits_passes_the_guard(guarded: Installed) -> None:
    admitted = 0
    for name, pod in _goldens():
        message = _dry_run(guarded.api, TEAM, pod)
        assert message is None or GUARDED not in message, (name, message)
        admitted += message is None
    assert admitted >= 10  # GPU pods among them, set up by the webhook and passed


def _audited(installed: Installed) -> str:
    """The guard's audit annotations on pod creates, one per line."""
    found = []
    for line in installed.plane.audit_log.read_text().splitlines():
        event = json.loads(line)
        value = event.get("annotations", {}).get(f"{GUARD}/refused")
        if value and event.get("objectRef", {}).get("resource") == "pods":
            found.append(value)
    return "\n".join(found)


def _patch_webhook(installed: Installed, path: str, value: Any) -> None:
    patch = json.dumps([{"op": "replace", "path": f"/webhooks/0/{path}", "value": value}])
    installed.plane.kubectl(
        "patch", "mutatingwebhookconfiguration", "gpushare-webhook", "--type=json", "-p", patch
    )


@contextlib.contextmanager
def configuration_edited(installed: Installed) -> Iterator[None]:
    """The webhook's configuration edited so that it is called for no pod create, as an upgrade
    gone wrong leaves it. (Not deleted: its Secrets belong to it, and would go with it.)"""
    _patch_webhook(installed, "rules/0/operations", ["UPDATE"])
    try:
        yield
    finally:
        _patch_webhook(installed, "rules/0/operations", ["CREATE"])


def test_with_the_webhook_configuration_edited_gpu_pods_are_refused_by_the_guard(
    guarded: Installed,
) -> None:
    with configuration_edited(guarded):
        message = refusal(
            lambda: client.CoreV1Api(guarded.api).create_namespaced_pod(
                TEAM, pod_manifest("bypassed", gpu_container(gpu="4")), dry_run="All"
            )
        )
        assert GUARDED in message
        assert "the pod lacks schedulerName default-scheduler" not in message  # the API's default
        assert "the annotation gpushare-webhook.io/status" in message
        assert "container 'main' lacks the shim mounted at /usr/local/vgpu" in message
        assert "CUDA_DEVICE_MEMORY_LIMIT=4096m" in message
        assert "check the MutatingWebhookConfiguration gpushare-webhook" in message
        # What the webhook never touches, the guard never refuses.
        for namespace in (OPTED_OUT, "kube-system", NS):
            assert (
                _dry_run(guarded.api, namespace, pod_manifest("skipped", gpu_container())) is None
            )
        assert _dry_run(guarded.api, TEAM, pod_manifest("cpu", gpu_container(gpu=None))) is None
        # Where the webhook only warns, so does the guard: the pod is admitted, with it.
        warned = guarded.plane.kubectl(
            "create",
            "--dry-run=server",
            "-n",
            WARNED,
            "-f",
            "-",
            stdin=json.dumps(pod_manifest("warned", gpu_container())),
            check=False,
        )
        assert warned.returncode == 0, warned.stderr
        assert warned.stderr.startswith("Warning: "), warned.stderr
        assert GUARDED in warned.stderr, warned.stderr


def test_with_failure_policy_ignore_and_the_webhook_down_the_guard_refuses(
    guarded: Installed,
) -> None:
    _patch_webhook(guarded, "failurePolicy", "Ignore")
    guarded.stop_webhook()
    try:
        message = _dry_run(guarded.api, TEAM, pod_manifest("ignored", gpu_container(gpu="2")))
        assert message is not None
        assert GUARDED in message, message
        assert "CUDA_DEVICE_MEMORY_LIMIT=2048m" in message
        # No metric from inside the API server, but its audit log names the guard.
        eventually(lambda: "CUDA_DEVICE_MEMORY_LIMIT=2048m" in _audited(guarded), timeout=15)
    finally:
        guarded.start_webhook()
        _patch_webhook(guarded, "failurePolicy", "Fail")


def test_a_later_webhook_that_strips_the_shims_env_is_caught(
    guarded: Installed, pki: tls.Issued
) -> None:
    with stripping(guarded, pki):
        message = _stripped(guarded)
    assert message is not None
    assert GUARDED in message, message
    assert "container 'main' lacks the shim first in LD_PRELOAD" in message
    assert "CUDA_DEVICE_MEMORY_LIMIT=4096m" in message
    assert "the pod lacks" not in message  # the volumes and the annotation stayed


@contextlib.contextmanager
def judging(guarded: Installed, policy: Path, name: str) -> Iterator[None]:
    """The guard of ``policy``, named ``name`` (each its own: a removed one may linger a
    moment), bound with Deny to OPTED_OUT alone, whose pods the installed webhook skips:
    they reach it as they are written. Active once a bare GPU pod is refused by it."""
    variant, binding, *_ = _made(policy)
    variant["metadata"]["name"] = name
    variant["spec"]["matchConstraints"]["namespaceSelector"] = {
        "matchLabels": {"kubernetes.io/metadata.name": OPTED_OUT}
    }
    binding = {**binding, "metadata": {"name": name}}
    binding["spec"] = {"policyName": name, "validationActions": ["Deny"]}
    resource = parse_policy_text(policy.read_text()).resource_name
    probe = pod_manifest(
        "probe", {"name": "main", "image": "cuda", "resources": {"limits": {resource: "1"}}}
    )
    _apply(guarded, [variant, binding])
    try:
        eventually(lambda: f"'{name}'" in (_dry_run(guarded.api, OPTED_OUT, probe) or ""))
        yield
    finally:
        guarded.plane.kubectl(
            "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name
        )


VARIANTS = {
    # policy: (pod labels, container resources, what the raw pod's refusal names)
    "scheduler: ack\n": (
        {"aliyun.com/gpu-count": "2"},
        {"aliyun.com/gpu-mem": "8"},
        "CUDA_DEVICE_MEMORY_LIMIT_0.._1=4096m",
    ),
    "scheduler: ack\nmemoryUnit: MiB\nmultiGpu: {countFrom: resource, memory: perDevice}\n"
    "compute: {default: proportional}\nshim: {ldSoPreload: true, overrideFile: ''}\n": (
        {},
        {"aliyun.com/gpu-mem": "3000", "aliyun.com/gpu-count": "3"},
        "CUDA_DEVICE_MEMORY_LIMIT_0.._2=3000m",
    ),
}


@pytest.mark.parametrize("policy", VARIANTS, ids=["ack-label-total", "ack-resource-per-device"])
def test_the_guard_reads_each_policys_set_up(
    guarded: Installed, tmp_path: Path, policy: str
) -> None:
    """Pods the webhook sets up under another policy (offline, by ``mutate``) pass that
    policy's guard; the same pods as written are refused, with that policy's limits.

    The guard is bound here to a namespace the installed webhook skips, with its
    opt-out left off the guard's own selector, so the pods reach it as written.
    """
    labels, resources, named = VARIANTS[policy]
    body = pod_manifest(
        "variant", {"name": "main", "image": "cuda", "resources": {"limits": resources}}
    )
    body["metadata"]["labels"] = labels
    body["spec"]["initContainers"] = [
        {"name": "warm", "image": "cuda", "resources": {"limits": dict(resources)}}
    ]
    mutated = _set_up_offline(tmp_path, policy, body)
    with judging(guarded, tmp_path / "policy.yaml", f"{GUARD}-variant-{len(policy)}"):
        message = _dry_run(guarded.api, OPTED_OUT, body) or ""
        assert named in message, message
        assert "container 'warm' lacks" in message  # init containers are held too
        assert _dry_run(guarded.api, OPTED_OUT, mutated) is None


def test_the_report_names_a_controller_whose_pods_the_guard_refused(
    guarded: Installed, tmp_path: Path
) -> None:
    """A Deployment made while the webhook is bypassed: its ReplicaSet's creates are refused,
    the events say so, and the report, as its own ServiceAccount, names the ReplicaSet."""
    plane = guarded.plane
    rendered = plane.kubectl("kustomize", str(ROOT / "manifests/overlays/report")).stdout
    rbac = [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and "report" in doc["metadata"]["name"] and doc["kind"] != "CronJob"
    ]
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bypassed", "namespace": TEAM},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "bypassed"}},
            "template": {
                "metadata": {"labels": {"app": "bypassed"}},
                "spec": {"containers": [gpu_container()]},
            },
        },
    }
    with configuration_edited(guarded):
        plane.kubectl("apply", "-f", "-", stdin=json.dumps(deployment))

        def refused() -> list[str]:
            events = client.CoreV1Api(guarded.api).list_namespaced_event(
                TEAM, field_selector="reason=FailedCreate"
            )
            return [e.message for e in events.items if GUARDED in (e.message or "")]

        try:
            eventually(refused, timeout=60)
        finally:
            plane.kubectl("delete", "deployment", "bypassed", "-n", TEAM, "--wait=true")
    kubeconfig = service_account_kubeconfig(plane, "gpushare-webhook-report", tmp_path)
    done = webhook_cli("report", "-o", "json", "-n", TEAM, "--kubeconfig", str(kubeconfig))
    assert done.returncode == 1, done.stderr
    (found,) = json.loads(done.stdout)["refusedByGuard"]
    assert (found["namespace"], found["kind"]) == (TEAM, "ReplicaSet")
    assert found["name"].startswith("bypassed-")
    assert found["message"].startswith(GUARDED)
    assert "container 'main' lacks the shim mounted at /usr/local/vgpu" in found["message"]


def test_every_rule_case_the_webhook_sets_up_passes_that_policys_guard(
    guarded: Installed, tmp_path: Path
) -> None:
    """tests/rules: each pod the webhook mutates (offline, with the case's policy and nodes),
    as mutated, created where that policy's guard alone judges it; none is refused by it."""
    by_policy: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path, index, case in CASES:
        got, ops = answer_of(case)
        if got["outcome"] != "mutated":
            continue  # refused (never stored), or warned: the guard only warns where it does
        pod = apply(case["object"] if "object" in case else _pod(case), ops)
        pod["metadata"] = {**pod["metadata"], "name": f"rule-{index}"}
        pod["metadata"].pop("namespace", None)
        for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            container.setdefault("image", "cuda")
        by_policy.setdefault(case.get("policy") or "", []).append((f"{path.stem}-{index}", pod))
    passed = 0
    for number, (text, pods) in enumerate(sorted(by_policy.items())):
        (tmp_path / f"{number}.yaml").write_text(text)
        with judging(guarded, tmp_path / f"{number}.yaml", f"{GUARD}-rules-{number}"):
            for case_id, pod in pods:
                message = _dry_run(guarded.api, OPTED_OUT, pod)
                assert message is None or GUARDED not in message, (case_id, message)
                passed += message is None
    assert passed >= 60, passed  # most pass the API server's own validation too


def _env(container: dict[str, Any], name: str, value: str) -> None:
    (entry,) = [e for e in container["env"] if e["name"] == name]
    entry["value"] = value


def _reclassed(pod: dict[str, Any]) -> None:
    claim = pod["spec"]["resourceClaims"][0]
    claim["resourceClaimTemplateName"] = "gpushare-4096mi.gpu.example.com"


def _stripped_env(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0].pop("env")


DRA_REFUSED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    # id: (how the set-up pod is changed, what the refusal names)
    "limit-off-its-template": (
        lambda pod: _env(pod["spec"]["containers"][0], "CUDA_DEVICE_MEMORY_LIMIT", "8192m"),
        "container 'main' (claim template gpushare-4096mi.gpu.nvidia.com) lacks "
        "CUDA_DEVICE_MEMORY_LIMIT=4096m",
    ),
    "a-claim-of-another-class": (
        _reclassed,
        "claim 'gpushare-main' is made from gpushare-4096mi.gpu.example.com, of the "
        "DeviceClass gpu.example.com, not gpu.nvidia.com",
    ),
    "still-asking-gpu-mem": (
        lambda pod: pod["spec"]["containers"][0]["resources"].__setitem__(
            "limits", {"aliyun.com/gpu-mem": "4"}
        ),
        "container 'main' asks aliyun.com/gpu-mem, which the webhook turns into a ResourceClaim",
    ),
    "the-shim-stripped": (
        _stripped_env,
        "lacks the shim first in LD_PRELOAD, CUDA_DEVICE_MEMORY_LIMIT=4096m",
    ),
}


def _dra_set_up(tmp_path: Path, policy: str, resources: dict[str, str]) -> dict[str, Any]:
    """A pod asking ``resources``, as the webhook sets it up under ``policy`` (offline)."""
    body = pod_manifest(
        "dra", {"name": "main", "image": "cuda", "resources": {"limits": resources}}
    )
    return _set_up_offline(tmp_path, policy, body)


def _set_up_offline(tmp_path: Path, policy: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as ``mutate`` sets it up under ``policy``, written to tmp_path/policy.yaml."""
    (tmp_path / "policy.yaml").write_text(policy)
    (tmp_path / "pod.json").write_text(json.dumps(body))
    mutated = webhook_cli(
        "mutate",
        str(tmp_path / "pod.json"),
        "--policy",
        str(tmp_path / "policy.yaml"),
        "-o",
        "json",
    )
    assert mutated.returncode == 0, mutated.stderr
    pod: dict[str, Any] = json.loads(mutated.stdout)
    return pod


def test_under_dra_the_guard_holds_each_container_to_its_claims_template(
    guarded: Installed, tmp_path: Path
) -> None:
    """Under scheduler: dra the pod the webhook sets up passes; the same pod with its limit
    off its template's size, a claim of another DeviceClass, a container still asking
    GPU memory, or the shim's env gone is refused, naming what is wrong."""
    pod = _dra_set_up(tmp_path, "scheduler: dra\n", {"aliyun.com/gpu-mem": "4"})
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpushare-main", "resourceClaimTemplateName": "gpushare-4096mi.gpu.nvidia.com"}
    ]
    with judging(guarded, tmp_path / "policy.yaml", f"{GUARD}-dra"):
        assert _dry_run(guarded.api, OPTED_OUT, pod) is None
        for case, (change, named) in DRA_REFUSED.items():
            changed = json.loads(json.dumps(pod))
            change(changed)
            message = _dry_run(guarded.api, OPTED_OUT, changed) or ""
            assert GUARDED in message, (case, message)
            assert named in message, (case, message)
        # A pod that names no claim of the webhook's and asks no GPU is not read at all.
        plain = pod_manifest("plain", {"name": "main", "image": "busybox"})
        plain["metadata"]["labels"] = {"gpushare-webhook.io/dra": "true"}
        assert _dry_run(guarded.api, OPTED_OUT, plain) is None


def test_under_dra_with_the_driver_setting_limits_only_the_claims_are_held(
    guarded: Installed, tmp_path: Path
) -> None:
    policy = (
        "scheduler: dra\ndra: {deviceClassName: hami-core-gpu.project-hami.io, "
        "driver: hami-core-gpu.project-hami.io, computeCapacity: cores, driverSetsLimits: true}\n"
    )
    pod = _dra_set_up(
        tmp_path, policy, {"aliyun.com/gpu-mem": "2", "aliyun.com/gpu-core.percentage": "25"}
    )
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == "gpushare-2048mi-c25.hami-core-gpu.project-hami.io"
    assert "env" not in pod["spec"]["containers"][0]
    # The guard of another scheduler's policy (the installed one) reads the pod for its
    # claim, and holds nothing: it asks no GPU memory.
    message = _dry_run(guarded.api, TEAM, pod)
    assert message is None or GUARDED not in message, message
    with judging(guarded, tmp_path / "policy.yaml", f"{GUARD}-dra-driver"):
        assert _dry_run(guarded.api, OPTED_OUT, pod) is None
        _reclassed(pod)
        message = _dry_run(guarded.api, OPTED_OUT, pod) or ""
        assert "not hami-core-gpu.project-hami.io" in message, message
