"""Admission end to end: kube-apiserver calls the webhook the manifests register.

Every pod here is created through the real API server (kubectl or the
kubernetes client) and read back from it, so what is checked is what a
cluster stores: defaulting, the ServiceAccount plugin's volume, the
matchConditions and namespaceSelector, reinvocation, warnings, audit.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.apiserver.helpers import (
    RESTRICTED,
    create_namespace,
    create_pod,
    delete_namespaces,
    delete_pod,
    gpu_container,
    pod_manifest,
    process_tree,
    refusal,
    register_webhook,
    stored_pod,
    tiny_webhook,
    wait_for_service_account,
)
from tests.controlplane.install import GUARD, NS, Installed
from tests.helpers import GPU, env_of, eventually
from webhook import tls
from webhook.decision import responses
from webhook.decision.guard import guard
from webhook.decision.policy import parse_policy_text

TEAM = "team-a"
SHIM = "/usr/local/vgpu/libvgpu.so"


@pytest.fixture(scope="module")
def cluster(installed: Installed) -> Iterator[Installed]:
    create_namespace(installed.api, TEAM)
    create_namespace(installed.api, "opted-out", {"gpushare-webhook.io/injection": "disabled"})
    for namespace in (TEAM, "opted-out", NS, "kube-system"):
        wait_for_service_account(installed.api, namespace)
    yield installed
    delete_namespaces(installed.api, TEAM, "opted-out")


@pytest.fixture
def own_namespace(cluster: Installed) -> Iterator[Callable[[str], str]]:
    """Makes a namespace for one test (ready for pods), deleted after it."""
    made: list[str] = []

    def make(name: str) -> str:
        create_namespace(cluster.api, name)
        wait_for_service_account(cluster.api, name)
        made.append(name)
        return name

    yield make
    delete_namespaces(cluster.api, *made)


def confined(stored: dict[str, Any], container: str, memory: str) -> bool:
    spec = stored["spec"]
    (found,) = [
        c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == container
    ]
    env = env_of(found)
    return (
        spec["schedulerName"] == "default-scheduler"
        and any(v["name"] == "gpushare-shim" for v in spec["volumes"])
        and any(m["name"] == "gpushare-shim" for m in found.get("volumeMounts", []))
        and env.get("CUDA_DEVICE_MEMORY_LIMIT") == memory
        and env.get("LD_PRELOAD", "").startswith(SHIM)
    )


def test_a_gpu_pod_is_stored_mutated(cluster: Installed) -> None:
    created = create_pod(cluster.api, TEAM, pod_manifest("train", gpu_container(gpu="4")))
    stored = stored_pod(cluster.api, TEAM, "train")
    assert stored["metadata"]["uid"] == created["metadata"]["uid"]
    assert confined(stored, "main", "4096m")
    status = json.loads(stored["metadata"]["annotations"]["gpushare-webhook.io/status"])
    assert status["demand"] == "4GiB"
    # The ServiceAccount admission plugin ran first: its token volume is kept beside ours.
    volumes = [v["name"] for v in stored["spec"]["volumes"]]
    assert any(name.startswith("kube-api-access-") for name in volumes), volumes


def test_a_non_root_pod_on_a_read_only_root_gets_its_accounting_volume(cluster: Installed) -> None:
    # The API server validates the volumes and mounts the webhook adds; the kubelet
    # (which makes the emptyDir mode 0777) does not run here: docs/security.md.
    hardened = {**RESTRICTED, "readOnlyRootFilesystem": True}
    init = gpu_container("warmup", gpu="2", securityContext=hardened)
    manifest = pod_manifest(
        "hardened",
        gpu_container(securityContext=hardened),
        initContainers=[init],
        securityContext={"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
    )
    create_pod(cluster.api, TEAM, manifest)
    stored = stored_pod(cluster.api, TEAM, "hardened")
    (volume,) = [v for v in stored["spec"]["volumes"] if v["name"] == "gpushare-accounting"]
    assert volume == {"name": "gpushare-accounting", "emptyDir": {"sizeLimit": "32Mi"}}
    spec = stored["spec"]
    step, warmup = spec["initContainers"]  # the shipped policy's init step first
    assert step["name"] == "gpushare-regions"
    assert step["command"][3:] == ["warmup=2048m", "main=4096m"]
    assert {"name": "gpushare-accounting", "mountPath": "/var/run/gpushare"} in step["volumeMounts"]
    mount = {"name": "gpushare-accounting", "mountPath": "/tmp/cudevshr.cache"}
    assert {**mount, "subPath": "warmup.cache"} in warmup["volumeMounts"]
    assert {**mount, "subPath": "main.cache"} in spec["containers"][0]["volumeMounts"]
    for found in (spec["containers"][0], warmup):
        mount = {"name": "gpushare-accounting", "mountPath": "/var/run/gpushare"}
        assert mount in found["volumeMounts"]
        env = env_of(found)
        assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"/var/run/gpushare/{found['name']}.cache"
        assert env["LD_PRELOAD"] == SHIM
    assert env_of(warmup)["CUDA_DEVICE_MEMORY_LIMIT"] == "2048m"


def test_a_pod_too_big_for_any_gpu_is_refused_with_our_message(cluster: Installed) -> None:
    manifest = json.dumps(pod_manifest("too-big", gpu_container(gpu="24")))
    done = cluster.plane.kubectl("apply", "-n", TEAM, "-f", "-", stdin=manifest, check=False)
    assert done.returncode != 0
    assert 'admission webhook "pods.gpushare-webhook.io" denied the request' in done.stderr
    assert (
        "asks 24 GiB of aliyun.com/gpu-mem per GPU, but the largest GPU has 16 GiB" in done.stderr
    )


def test_warnings_reach_kubectl(cluster: Installed) -> None:
    container = gpu_container(env=[{"name": "CUDA_DEVICE_MEMORY_LIMIT_3", "value": "80g"}])
    manifest = json.dumps(pod_manifest("warned", container))
    done = cluster.plane.kubectl("apply", "-n", TEAM, "-f", "-", stdin=manifest)
    assert (
        "Warning: container 'main': removed CUDA_DEVICE_MEMORY_LIMIT_3, which would override "
        "the limit the webhook sets" in done.stderr
    )
    assert "CUDA_DEVICE_MEMORY_LIMIT_3" not in env_of(
        stored_pod(cluster.api, TEAM, "warned")["spec"]["containers"][0]
    )


def test_env_from_cannot_loosen_a_pinned_limit(cluster: Installed) -> None:
    # A ConfigMap the webhook never sees, with and without a prefix: the stored pod
    # carries the webhook's env entries, which the kubelet puts over envFrom.
    loosening = {"CUDA_DEVICE_MEMORY_LIMIT_0": "80g", "CUDA_REDIRECT": "/usr/lib/libcuda.so.1"}
    for name, data in (("loosen", loosening), ("loosen-prefixed", {"MEMORY_LIMIT_0": "80g"})):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        cluster.plane.kubectl("apply", "-n", TEAM, "-f", "-", stdin=json.dumps(cm))
    env_from = [
        {"configMapRef": {"name": "loosen"}},
        {"configMapRef": {"name": "loosen-prefixed"}, "prefix": "CUDA_DEVICE_"},
    ]
    manifest = json.dumps(pod_manifest("env-from", gpu_container(envFrom=env_from)))
    cluster.plane.kubectl("apply", "-n", TEAM, "-f", "-", stdin=manifest)
    env = env_of(stored_pod(cluster.api, TEAM, "env-from")["spec"]["containers"][0])
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert env["CUDA_REDIRECT"] == "/usr/local/vgpu/libvgpu.so"


@contextlib.contextmanager
def _serving(cluster: Installed, text: str, *, probe: dict[str, Any]) -> Iterator[None]:
    """Serve policy ``text`` for the block, then the policy before it.

    A guard another test has bound follows the policy, as an operator keeps
    it (``policy guard`` after each edit; Helm on upgrade): made from
    ``text`` for the block, put back as it was after. The block starts once
    a pod of ``probe`` (a pod template) passes both.
    """
    served = Path(cluster.args[cluster.args.index("--policy") + 1])
    before = served.read_text()
    found = cluster.plane.kubectl("get", "validatingadmissionpolicy", "-o", "json").stdout
    saved = [p for p in json.loads(found)["items"] if p["metadata"]["name"] == GUARD]
    cluster.set_policy(text)
    try:
        if saved:
            _apply_policy(cluster, guard(parse_policy_text(text))[0])
        body = {"apiVersion": "v1", "kind": "Pod", **probe}
        body["metadata"] = {**probe.get("metadata", {}), "name": "probe"}
        core = client.CoreV1Api(cluster.api)

        def admitted() -> bool:
            try:
                core.create_namespaced_pod(TEAM, body, dry_run="All")
            except client.exceptions.ApiException:
                return False
            return True

        eventually(admitted)
        yield
    finally:
        cluster.set_policy(before)
        if saved:
            _apply_policy(cluster, saved[0])


def _apply_policy(cluster: Installed, policy: dict[str, Any]) -> None:
    kept = {
        k: policy["metadata"][k]
        for k in ("name", "labels", "annotations")
        if k in policy["metadata"]
    }
    body = {"apiVersion": policy["apiVersion"], "kind": policy["kind"], "metadata": kept}
    body["spec"] = policy["spec"]
    cluster.plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(body)
    )


def test_the_gpu_count_label_of_acks_sample_job_reaches_its_pod(cluster: Installed) -> None:
    # ACK's multi-GPU sample: the count is a label of the Job's pod template.
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "multigpu"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "multigpu", "aliyun.com/gpu-count": "2"}},
                "spec": {
                    "containers": [gpu_container(gpu="8")],
                    "restartPolicy": "Never",
                },
            }
        },
    }
    # Only ACK's scheduler reads the label; the open-source extender's default refuses it.
    served = Path(cluster.args[cluster.args.index("--policy") + 1])
    before = served.read_text()
    ack = yaml.safe_dump({**(yaml.safe_load(before) or {}), "scheduler": "ack"})
    core = client.CoreV1Api(cluster.api)
    with _serving(cluster, ack, probe=job["spec"]["template"]):
        cluster.plane.kubectl("apply", "-n", TEAM, "-f", "-", stdin=json.dumps(job))
        eventually(lambda: core.list_namespaced_pod(TEAM, label_selector="app=multigpu").items)
    (made,) = core.list_namespaced_pod(TEAM, label_selector="app=multigpu").items
    env = env_of(stored_pod(cluster.api, TEAM, made.metadata.name)["spec"]["containers"][0])
    limits = {k: v for k, v in env.items() if k.startswith("CUDA_DEVICE_MEMORY_LIMIT")}
    assert limits == dict.fromkeys(
        ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_MEMORY_LIMIT_1"],
        "4096m",
    )


@pytest.mark.parametrize(
    ("namespace", "why"),
    [
        (TEAM, "a pod that names no GPU memory"),
        ("kube-system", "kube-system is excluded by the namespaceSelector"),
        (NS, "the webhook's own namespace is excluded"),
        ("opted-out", "a namespace labelled gpushare-webhook.io/injection=disabled"),
    ],
    ids=["non-gpu-pod", "kube-system", "own-namespace", "opted-out"],
)
def test_pods_the_webhook_must_not_see_are_never_sent(
    cluster: Installed, namespace: str, why: str
) -> None:
    before = cluster.reviews()
    gpu = None if namespace == TEAM else "4"
    name = f"unsent-{namespace}"
    container = gpu_container(gpu=gpu, securityContext=RESTRICTED)
    create_pod(cluster.api, namespace, pod_manifest(name, container))
    stored = stored_pod(cluster.api, namespace, name)
    assert stored["spec"]["schedulerName"] == "default-scheduler", why
    assert "gpushare-webhook.io/status" not in stored["metadata"].get("annotations", {}), why
    assert cluster.reviews() == before, why


WORKLOADS = {
    "Deployment": {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "dep"}}},
    },
    "Job": {"apiVersion": "batch/v1", "kind": "Job", "spec": {"backoffLimit": 0}},
    "StatefulSet": {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "spec": {"serviceName": "sts", "selector": {"matchLabels": {"app": "sts"}}},
    },
}


@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_controllers_create_pods_that_are_mutated(cluster: Installed, kind: str) -> None:
    app = {"Deployment": "dep", "Job": "job", "StatefulSet": "sts"}[kind]
    workload: dict[str, Any] = json.loads(json.dumps(WORKLOADS[kind]))
    workload["metadata"] = {"name": f"{app}-gpu"}
    restart = "Never" if kind == "Job" else "Always"
    workload["spec"]["template"] = {
        "metadata": {"labels": {"app": app}},
        "spec": {"restartPolicy": restart, "containers": [gpu_container(gpu="2")]},
    }
    cluster.plane.kubectl("apply", "-n", TEAM, "-f", "-", stdin=json.dumps(workload))
    core = client.CoreV1Api(cluster.api)

    def pods() -> list[Any]:
        return list(core.list_namespaced_pod(TEAM, label_selector=f"app={app}").items)

    eventually(lambda: len(pods()) >= 1, timeout=60)
    for found in pods():
        stored = stored_pod(cluster.api, TEAM, found.metadata.name)
        assert confined(stored, "main", "2048m"), stored["spec"]
        if kind != "StatefulSet":  # a StatefulSet names its pods itself: <name>-0
            assert stored["metadata"]["generateName"], stored["metadata"]


def test_a_later_webhook_changing_the_pod_reinvokes_ours(
    cluster: Installed, pki: tls.Issued, own_namespace: Callable[[str], str]
) -> None:
    """A sidecar injector after ours adds a GPU container; IfNeeded calls ours again."""
    namespace = own_namespace("reinvoke")

    def add_sidecar(request: dict[str, Any]) -> dict[str, Any]:
        containers = request["object"]["spec"]["containers"]
        if any(c["name"] == "sidecar" for c in containers):
            return {"uid": request["uid"], "allowed": True}
        sidecar = {
            "name": "sidecar",
            "image": "busybox",
            "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
        }
        patch = [{"op": "add", "path": "/spec/containers/-", "value": sidecar}]
        return {
            "uid": request["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        }

    with tiny_webhook(pki.cert, pki.key, add_sidecar) as port:
        # Webhooks run in the order of their configurations' names: this one after ours.
        register_webhook(
            cluster.plane, "zz-sidecar", port=port, ca_pem=pki.ca.read_bytes(), namespace=namespace
        )
        try:
            name = "reinvoked"

            def created() -> bool:
                create_pod(cluster.api, namespace, pod_manifest(name, gpu_container(gpu="3")))
                stored = stored_pod(cluster.api, namespace, name)
                if len(stored["spec"]["containers"]) == 2:
                    return True
                delete_pod(cluster.api, namespace, name)
                return False

            before = cluster.reviews()
            eventually(created, timeout=30)
            stored = stored_pod(cluster.api, namespace, name)
            assert confined(stored, "main", "3072m")
            assert confined(stored, "sidecar", "1024m")
            status = json.loads(stored["metadata"]["annotations"]["gpushare-webhook.io/status"])
            assert status["demand"] == "4GiB"
            assert cluster.reviews() - before >= 2  # the first call, and the reinvocation
        finally:
            cluster.plane.kubectl("delete", "mutatingwebhookconfiguration", "zz-sidecar")


def test_an_ephemeral_container_is_judged(cluster: Installed) -> None:
    create_pod(cluster.api, TEAM, pod_manifest("debugged", gpu_container(gpu="2")))
    done = cluster.plane.kubectl(
        "debug", "-n", TEAM, "debugged", "--image=busybox", "--profile=sysadmin", check=False
    )
    assert done.returncode != 0
    assert 'admission webhook "pods.gpushare-webhook.io" denied the request' in done.stderr
    assert "sets securityContext.privileged: true" in done.stderr
    allowed = cluster.plane.kubectl("debug", "-n", TEAM, "debugged", "--image=busybox")
    assert "debugger" in allowed.stdout + allowed.stderr
    spec = stored_pod(cluster.api, TEAM, "debugged")["spec"]
    assert [c["image"] for c in spec["ephemeralContainers"]] == ["busybox"]


def test_the_audit_log_carries_our_annotations(cluster: Installed) -> None:
    create_pod(cluster.api, TEAM, pod_manifest("audited", gpu_container(gpu="1")))

    def annotations() -> dict[str, str]:
        for line in cluster.plane.audit_log.read_text().splitlines():
            event = json.loads(line)
            ref = event.get("objectRef", {})
            if (
                ref.get("resource") == "pods"
                and ref.get("name") == "audited"
                and event.get("verb") == "create"
                and event.get("stage") == "ResponseComplete"
            ):
                found: dict[str, str] = event.get("annotations", {})
                return found
        return {}

    eventually(annotations, timeout=15)
    found = annotations()
    assert found["pods.gpushare-webhook.io/decision"] == "mutated"
    assert found["pods.gpushare-webhook.io/reason"] == "mutated"
    # The API server's own record that our webhook changed the pod.
    assert any(key.startswith("mutation.webhook.admission.k8s.io/") for key in found), found


def test_webhook_down_refuses_gpu_pods_and_admits_the_rest(cluster: Installed) -> None:
    cluster.stop_webhook()
    try:
        message = refusal(
            lambda: create_pod(cluster.api, TEAM, pod_manifest("while-down", gpu_container()))
        )
        assert 'failed calling webhook "pods.gpushare-webhook.io"' in message
        assert "connection refused" in message
        create_pod(cluster.api, TEAM, pod_manifest("plain-while-down", gpu_container(gpu=None)))
    finally:
        cluster.start_webhook()


def test_a_webhook_slower_than_its_timeout_refuses_in_about_that_time(cluster: Installed) -> None:
    timeout = cluster.webhook_timeout()
    pids = process_tree(cluster.server.process.pid)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # the socket still accepts; nothing answers
    try:
        started = time.monotonic()
        message = refusal(
            lambda: create_pod(cluster.api, TEAM, pod_manifest("too-slow", gpu_container()))
        )
        took = time.monotonic() - started
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert 'failed calling webhook "pods.gpushare-webhook.io"' in message
    assert "deadline exceeded" in message or "timeout" in message.lower(), message
    assert timeout - 0.5 <= took <= timeout + 3, took


@pytest.mark.parametrize("failure_policy", ["Ignore", "Fail"])
def test_an_internal_error_refuses_the_pod_whatever_the_failure_policy(
    cluster: Installed, pki: tls.Issued, failure_policy: str, own_namespace: Callable[[str], str]
) -> None:
    """The webhook answers a bug in-band (allowed: false, code 500), never with HTTP 500.

    The real webhook has no bug to produce on demand, so a tiny webhook sends
    the exact answer the webhook's own code builds for one.
    """
    namespace = own_namespace(f"errored-{failure_policy.lower()}")

    def errored(request: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = responses.errored(
            request["uid"], "KeyError while admitting the pod"
        )
        return answer

    with tiny_webhook(pki.cert, pki.key, errored) as port:
        register_webhook(
            cluster.plane,
            "zz-errored",
            port=port,
            ca_pem=pki.ca.read_bytes(),
            namespace=namespace,
            failure_policy=failure_policy,
        )
        try:
            messages: list[str] = []

            def refused() -> bool:
                try:
                    create_pod(
                        cluster.api, namespace, pod_manifest("errored", gpu_container(gpu="1"))
                    )
                except client.exceptions.ApiException as error:
                    messages.append(json.loads(error.body)["message"])
                    return True
                delete_pod(cluster.api, namespace, "errored")
                return False

            eventually(refused, timeout=30)
        finally:
            cluster.plane.kubectl("delete", "mutatingwebhookconfiguration", "zz-errored")
    assert "gpushare-webhook internal error: KeyError while admitting the pod" in messages[-1]
    assert "denied the request" in messages[-1]
