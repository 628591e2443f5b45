"""A small, real HTTP server that speaks the parts of the Kubernetes API the project uses.

Secrets (get, create, update), MutatingWebhookConfigurations (get, JSON
patch) and Nodes (list and watch, with resourceVersions and broken
watches). Tests point the real ``kubernetes`` client at it with a
kubeconfig, so every request crosses a socket as it would in a cluster.

The real kube-apiserver (tests/apiserver, tests/controlplane) is the
authority; this stand-in is kept for what it cannot produce on demand:
HTTP 500 answers, answers delayed by a set time, a watch cut after a given
number of events, and a refusal of one write in the middle of an install,
all in tests that need no Go toolchain. Whatever the real server can show (certs
install, RBAC, the node watch's adds, changes, deletes and 410 Gone after a
compaction, node pools) is tested there and not here.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonpatch

SECRETS = re.compile(r"/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?")
MWCS = re.compile(r"/apis/admissionregistration\.k8s\.io/v1/mutatingwebhookconfigurations/([^/]+)")
NODES = "/api/v1/nodes"


class FakeApi:
    """In-memory state plus switches for the failures a test wants."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.version = 100
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.mwcs: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []  # (rv, type, node)
        self.deny: set[tuple[str, str]] = set()  # (verb, resource)
        self.requests: list[tuple[str, str]] = []
        self.break_watch_after: int | None = None  # events sent before a watch is cut
        self.fail_next = 0  # answer this many requests with 500
        self.delay = 0.0

    def next_version(self) -> str:
        self.version += 1
        return str(self.version)

    def add_webhook_config(self, name: str, hooks: int = 1) -> None:
        self.mwcs[name] = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {
                "name": name,
                "uid": f"00000000-0000-4000-8000-{len(self.mwcs):012d}",  # as the API sets one
                "resourceVersion": self.next_version(),
            },
            "webhooks": [
                {
                    "name": f"hook{i}.gpushare-webhook.io",
                    "clientConfig": {
                        "service": {"name": "gpushare-webhook", "namespace": "gpushare-system"}
                    },
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                }
                for i in range(hooks)
            ],
        }

    def put_node(
        self,
        name: str,
        *,
        memory: int,
        count: int,
        labels: dict[str, str] | None = None,
        event: str | None = None,
    ) -> None:
        with self.lock:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels or {},
                    "resourceVersion": self.next_version(),
                },
                "status": {
                    "capacity": {
                        "aliyun.com/gpu-mem": str(memory),
                        "aliyun.com/gpu-count": str(count),
                        "cpu": "8",
                    }
                },
            }
            kind = event or ("MODIFIED" if name in self.nodes else "ADDED")
            self.nodes[name] = node
            self.events.append((self.version, kind, copy.deepcopy(node)))
            self.lock.notify_all()


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class Handler(BaseHTTPRequestHandler):
    api: FakeApi
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _route(self, verb: str) -> None:
        api = self.api
        path, _, query = self.path.partition("?")
        api.requests.append((verb, path))
        if api.delay:
            time.sleep(api.delay)
        if api.fail_next > 0:
            api.fail_next -= 1
            self._send(500, _status(500, "InternalError", "injected failure"))
            return
        if m := SECRETS.fullmatch(path):
            self._secrets(verb, m[1], m[2])
        elif m := MWCS.fullmatch(path):
            self._mwc(verb, m[1])
        elif path == NODES and verb == "get":
            params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            if params.get("watch") in ("true", "1"):
                self._watch(
                    int(params.get("resourceVersion") or 0),
                    float(params.get("timeoutSeconds") or 5),
                )
            else:
                self._list_nodes()
        else:
            # The connection is kept alive: a body left unread would be the next request.
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(404, _status(404, "NotFound", f"no route {path}"))

    def _denied(self, verb: str, resource: str) -> bool:
        if (verb, resource) in self.api.deny:
            self._send(403, _status(403, "Forbidden", f"{resource} is forbidden: cannot {verb}"))
            return True
        return False

    def _secrets(self, verb: str, namespace: str, name: str | None) -> None:
        api = self.api
        if self._denied(verb if verb != "put" else "update", "secrets"):
            return
        if verb == "get":
            secret = api.secrets.get((namespace, name or ""))
            if secret is None:
                self._send(404, _status(404, "NotFound", f'secrets "{name}" not found'))
            else:
                self._send(200, secret)
        elif verb == "post":
            body = self._body()
            key = (namespace, body["metadata"]["name"])
            if key in api.secrets:
                self._send(409, _status(409, "AlreadyExists", "exists"))
                return
            body["metadata"]["resourceVersion"] = api.next_version()
            api.secrets[key] = body
            self._send(201, body)
        elif verb == "put":
            body = self._body()
            current = api.secrets.get((namespace, name or ""))
            if current is None:
                self._send(404, _status(404, "NotFound", "not found"))
                return
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                self._send(409, _status(409, "Conflict", "the object has been modified"))
                return
            body["metadata"]["resourceVersion"] = api.next_version()
            api.secrets[(namespace, name or "")] = body
            self._send(200, body)

    def _mwc(self, verb: str, name: str) -> None:
        api = self.api
        if self._denied(verb, "mutatingwebhookconfigurations"):
            return
        current = api.mwcs.get(name)
        if current is None:
            self._send(
                404, _status(404, "NotFound", f'mutatingwebhookconfigurations "{name}" not found')
            )
            return
        if verb == "get":
            self._send(200, current)
        elif verb == "patch":
            assert self.headers["Content-Type"] == "application/json-patch+json"
            try:
                patched = jsonpatch.apply_patch(current, self._body())
            except jsonpatch.JsonPatchTestFailed:
                self._send(409, _status(409, "Conflict", "test failed"))
                return
            patched["metadata"]["resourceVersion"] = api.next_version()
            api.mwcs[name] = patched
            self._send(200, patched)

    def _list_nodes(self) -> None:
        api = self.api
        if self._denied("list", "nodes"):
            return
        with api.lock:
            body = {
                "apiVersion": "v1",
                "kind": "NodeList",
                "metadata": {"resourceVersion": str(api.version)},
                "items": list(copy.deepcopy(api.nodes).values()),
            }
        self._send(200, body)

    def _watch(self, since: int, timeout: float) -> None:
        api = self.api
        if self._denied("watch", "nodes"):
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(obj: Any) -> None:
            data = json.dumps(obj).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        deadline = time.monotonic() + min(timeout, 30)
        sent = 0
        cursor = since
        try:
            while time.monotonic() < deadline:
                with api.lock:
                    pending = [e for e in api.events if e[0] > cursor]
                    if not pending:
                        api.lock.wait(timeout=0.1)
                        continue
                for rv, kind, node in pending:
                    if api.break_watch_after is not None and sent >= api.break_watch_after:
                        api.break_watch_after = None
                        self.close_connection = True
                        return  # cut mid-stream, no terminating chunk
                    chunk({"type": kind, "object": node})
                    cursor = rv
                    sent += 1
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return

    def do_GET(self) -> None:
        self._route("get")

    def do_POST(self) -> None:
        self._route("post")

    def do_PUT(self) -> None:
        self._route("put")

    def do_PATCH(self) -> None:
        self._route("patch")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that stops reading (a watch cut short, a command that exits)
        # is an ordinary end of a call here, not an error to print.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serve(tmp: Path) -> Iterator[tuple[FakeApi, Path]]:
    """Run a FakeApi on loopback; yield it and a kubeconfig that points at it."""
    api = FakeApi()
    handler = type("BoundHandler", (Handler,), {"api": api})
    httpd = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    port = httpd.server_address[1]
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                "current-context": "fake",
            }
        )
    )
    try:
        yield api, kubeconfig
    finally:
        httpd.shutdown()
        httpd.server_close()
