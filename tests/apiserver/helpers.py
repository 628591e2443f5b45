"""Shared pieces of the real-control-plane tier: pods as an API server stores them,
a tiny second webhook served by a test, and the processes of a running server."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.conftest import Server
from tests.controlplane.cluster import ControlPlane
from tests.helpers import container, eventually, pod

SHIM_LABEL = "gpushare-webhook.io/shim"  # the node agent sets it where the shim is installed

# What PodSecurity's "restricted" level asks of every container (the webhook's
# own namespace warns and audits by it).
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def gpu_container(name: str = "main", gpu: str | None = "4", **extra: Any) -> dict[str, Any]:
    """tests.helpers.container, asking 4 GiB unless told otherwise."""
    return container(name, gpu, **extra)


def pod_manifest(
    name: str, *containers: dict[str, Any], labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """tests.helpers.pod named ``name``, to create in the namespace a test chooses."""
    return pod(*containers, name=name, namespace=None, labels=labels or {}, **spec)


def create_namespace(
    api: client.ApiClient, name: str, labels: dict[str, str] | None = None
) -> None:
    """A fresh namespace ``name``: one left by an earlier test is deleted and waited for
    (a namespace being deleted refuses new pods), then made anew."""
    core = client.CoreV1Api(api)
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as error:
            return error.status == 404
        return False

    eventually(gone, timeout=120)
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels or {}},
    }
    core.create_namespace(body)


def apply_server_side(plane: ControlPlane, manifests: str) -> None:
    """``kubectl apply --server-side`` of YAML text, as the tests' own field manager."""
    plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=gpushare-tests",
        "-f",
        "-",
        stdin=manifests,
    )


def wait_for_service_account(api: client.ApiClient, namespace: str) -> None:
    """Pods are refused until the controller manager has made the namespace's 'default'."""
    core = client.CoreV1Api(api)

    def ready() -> bool:
        try:
            core.read_namespaced_service_account("default", namespace)
        except ApiException:
            return False
        return True

    eventually(ready, timeout=30)


def stored_pod(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The pod as the API server stores it, as plain JSON (camelCase keys)."""
    core = client.CoreV1Api(api)
    raw = core.read_namespaced_pod(name, namespace, _preload_content=False)
    data: dict[str, Any] = json.loads(raw.data)
    return data


def create_pod(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    raw = core.create_namespaced_pod(namespace, body, _preload_content=False)
    data: dict[str, Any] = json.loads(raw.data)
    return data


def refusal(fn: Callable[[], Any]) -> str:
    """The API server's message for a create that must fail."""
    try:
        fn()
    except ApiException as error:
        body = json.loads(error.body or "{}")
        return str(body.get("message", error.body))
    raise AssertionError("the request was accepted")


def delete_pod(api: client.ApiClient, namespace: str, name: str) -> None:
    """Delete a pod at once and wait until the API server no longer has it."""
    core = client.CoreV1Api(api)
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as error:
            return bool(error.status == 404)
        return False

    eventually(gone)


def put_node(
    api: client.ApiClient,
    name: str,
    *,
    memory: int,
    count: int,
    labels: dict[str, str] | None = None,
    shim: bool = True,
) -> None:
    """Create (or update) a Node and report GPU capacity through its status, as a kubelet would.

    ``shim``: the node carries the label the node agent sets once the shim is
    installed, as every GPU node of the shipped manifests does; a GPU pod is
    placed, and sized, only by such nodes when the policy requires the label.
    """
    core = client.CoreV1Api(api)
    labels = {**(labels or {}), **({SHIM_LABEL: "0123456789ab"} if shim else {})}
    metadata = {"name": name, "labels": labels}
    try:
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": metadata})
    except ApiException as error:
        if error.status != 409:
            raise
        core.patch_node(name, {"metadata": {"labels": labels}})
    capacity = {"aliyun.com/gpu-mem": str(memory), "aliyun.com/gpu-count": str(count), "cpu": "8"}
    core.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity}})


def delete_nodes(api: client.ApiClient, *, seen_by: Server | None = None) -> None:
    """Delete every Node and wait until none is left: the next test starts from no GPU nodes.

    ``seen_by``, a server watching nodes (the installed webhook), is waited
    for too: until its watch has seen them go, it still bounds pods by them.
    """
    core = client.CoreV1Api(api)
    for node in core.list_node().items:
        with contextlib.suppress(ApiException):
            core.delete_node(node.metadata.name)
    eventually(lambda: not core.list_node().items)
    if seen_by is not None:
        eventually(lambda: seen_by.metrics().get("gpushare_nodes_known") == 0, timeout=60)


def delete_namespaces(api: client.ApiClient, *names: str) -> None:
    """Delete namespaces a test made; the namespace controller finishes on its own."""
    core = client.CoreV1Api(api)
    for name in names:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


def shared_objects(api: client.ApiClient) -> set[str]:
    """What tests may leave in the shared control plane: nodes, live namespaces, webhooks,
    admission policies (the guard) and their bindings."""
    core = client.CoreV1Api(api)
    found = {f"node/{n.metadata.name}" for n in core.list_node().items}
    found |= {
        f"namespace/{n.metadata.name}"
        for n in core.list_namespace().items
        if n.metadata.deletion_timestamp is None
    }
    admission = client.AdmissionregistrationV1Api(api)
    found |= {
        f"mutatingwebhookconfiguration/{c.metadata.name}"
        for c in admission.list_mutating_webhook_configuration().items
    }
    found |= {
        f"validatingadmissionpolicy/{p.metadata.name}"
        for p in admission.list_validating_admission_policy().items
    }
    found |= {
        f"validatingadmissionpolicybinding/{b.metadata.name}"
        for b in admission.list_validating_admission_policy_binding().items
    }
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and all of its descendants (gunicorn's master and workers)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                queue.extend(int(c) for c in (task / "children").read_text().split())
    return found


def watch_pid(log: Path) -> int:
    """The pid of a server's node watch process, from its start-up log line."""
    for line in log.read_text().splitlines():
        if "node watch started" in line:
            return int(json.loads(line)["pid"])
    raise AssertionError(f"no node watch in {log}")


def connected_to(port: int, pids: list[int]) -> set[int]:
    """Which of ``pids`` hold an established TCP connection to ``port`` on loopback."""
    sockets: dict[str, int] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    sockets[target[8:-1]] = pid
    holders = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port and inode in sockets:
                holders.add(sockets[inode])
    return holders


Handler = Callable[[dict[str, Any]], dict[str, Any]]


@contextlib.contextmanager
def tiny_webhook(cert: Path, key: str | Path, answer: Handler) -> Iterator[int]:
    """An HTTPS webhook on loopback whose response to each review is ``answer(request)``."""

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = json.dumps(
                {
                    "apiVersion": review["apiVersion"],
                    "kind": "AdmissionReview",
                    "response": answer(review["request"]),
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def register_webhook(
    plane: ControlPlane,
    name: str,
    *,
    port: int,
    ca_pem: bytes,
    namespace: str,
    failure_policy: str = "Fail",
    reinvocation: str = "Never",
    path: str = "/",
) -> None:
    """A MutatingWebhookConfiguration for a tiny webhook, scoped to one namespace."""
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"{name}.tests.gpushare-webhook.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "failurePolicy": failure_policy,
                "reinvocationPolicy": reinvocation,
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}{path}",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            }
        ],
    }
    plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(config)
    )


def cli_json(*args: str, plugin: bool = False) -> tuple[int, dict[str, Any]]:
    """Run the CLI (as ``kubectl gpushare`` with ``plugin``): its exit code, its JSON output."""
    command = ["kubectl", "gpushare"] if plugin else [sys.executable, "-m", "webhook"]
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)
