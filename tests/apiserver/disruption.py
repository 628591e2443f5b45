"""Disruptions under a steady stream of pod creates: the parts the test and the bench share.

Two or more real ``serve`` replicas (gunicorn, TLS, the pair ``certs
install`` issued, each with its own mounted files) behind
tests.apiserver.service, a home-made stand-in for a Service (the tier has
no kube-proxy) whose endpoint list follows the replicas' readiness a lag
late; creator threads that create GPU and other pods at a steady rate; and
the events: a rolling update (SIGTERM one replica after its successor is
ready, then the next), a rotation of the serving pair (``certs install``,
then each replica's mounted files a second apart, as the kubelet updates
them), a policy edit (the ConfigMap, then each replica's file a second
apart), a guard upgrade (the guard applied again, made from the edited
policy) and a replica killed with SIGKILL. Every create is tagged with the
event under way when it was sent. Used by tests/apiserver/test_disruption.py
and bench/disruption.py.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.apiserver.helpers import apply_server_side, gpu_container, pod_manifest, process_tree
from tests.apiserver.service import Service
from tests.conftest import Server, free_port, start_server, stop_server
from tests.controlplane.install import (
    GUARD,
    NS,
    Installed,
    api_client,
    install_certs,
    webhook_cli,
    write_policy,
)
from tests.helpers import eventually

GUARDED = "gpushare-webhook guard: "  # how the guard's refusals begin
EXCLUDED = "excludeNamespaces: [kube-system, gpushare-system]"
EDITED = "excludeNamespaces: [kube-system, gpushare-system, batch-ci]"


def publish(directory: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` the way the kubelet updates a mounted Secret or ConfigMap: one swap."""
    generation = f"..{time.monotonic_ns()}"
    (directory / generation).mkdir(parents=True)
    for name, data in files.items():
        (directory / generation / name).write_bytes(data)
    link = directory / "..data_tmp"
    link.symlink_to(generation)
    os.replace(link, directory / "..data")
    for name in files:
        with contextlib.suppress(FileExistsError):
            (directory / name).symlink_to(f"..data/{name}")


def serving_secret(installed: Installed) -> dict[str, bytes]:
    data = client.CoreV1Api(installed.api).read_namespaced_secret("gpushare-webhook-tls", NS).data
    return {key: base64.b64decode(data[key]) for key in ("tls.crt", "tls.key")}


def policy_text(installed: Installed) -> str:
    core = client.CoreV1Api(installed.api)
    text: str = core.read_namespaced_config_map("gpushare-webhook-policy", NS).data["policy.yaml"]
    return text


def apply_guard(installed: Installed, policy: str, folder: Path) -> None:
    """``policy guard`` of ``policy``, applied server-side as an upgrade applies it."""
    path = folder / f"guard-policy-{time.monotonic_ns()}.yaml"
    path.write_text(policy)
    made = webhook_cli("policy", "guard", str(path))
    assert made.returncode == 0, made.stderr
    apply_server_side(installed.plane, made.stdout)


def remove_guard(installed: Installed) -> None:
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        for name in installed.plane.kubectl("get", kind, "-o", "name").stdout.split():
            if name.split("/", 1)[1].startswith(GUARD):
                installed.plane.kubectl("delete", name, "--wait=true")


@dataclass
class Replicas:
    """The Deployment's replicas as processes, each with its own mounted files."""

    installed: Installed
    service: Service
    folder: Path
    drain: float
    running: dict[int, Server] = field(default_factory=dict)

    def start(self) -> int:
        """A new replica, once the Service routes to it."""
        port = free_port()
        mounts = self.folder / str(port)
        publish(mounts / "tls", serving_secret(self.installed))
        publish(mounts / "policy", {"policy.yaml": policy_text(self.installed).encode()})
        self.running[port] = start_server(
            [
                *("--cert", str(mounts / "tls" / "tls.crt")),
                *("--key", str(mounts / "tls" / "tls.key")),
                *("--policy", str(mounts / "policy" / "policy.yaml")),
                *("--workers", "2", "--drain", str(self.drain)),
            ],
            ca=self.installed.server.ca,
            log=mounts / "serve.log",
            port=port,
            host="127.0.0.1",
        )
        self.service.add(port)
        eventually(lambda: port in self.service.routed(), timeout=30)
        return port

    def terminate(self, port: int) -> None:
        """SIGTERM, as the kubelet sends it, and wait for the drain and the stop."""
        server = self.running.pop(port)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=self.drain + 30) == 0

    def kill(self, port: int) -> None:
        """SIGKILL to every process of the replica, as a container's cgroup is killed."""
        server = self.running.pop(port)
        for pid in process_tree(server.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.process.wait(timeout=10)

    def publish(self, name: str, files: dict[str, bytes]) -> None:
        """New mounted files for each replica in turn, a second apart."""
        for port in list(self.running):
            publish(self.folder / str(port) / name, files)
            time.sleep(1.0)

    def stop(self) -> None:
        for server in self.running.values():
            stop_server(server)
        self.running.clear()

    # The events.

    def rolling_update(self) -> None:
        for old in list(self.running):
            self.start()  # maxSurge 1, maxUnavailable 0: the new one is ready first
            self.terminate(old)

    def rotate(self) -> None:
        # The serving pair (it lives a year), not the CA: a shared control plane keeps its CA.
        done = install_certs(self.installed.certs_kubeconfig, "--renew-before=400d")
        assert done.returncode == 0, done.stderr
        self.publish("tls", serving_secret(self.installed))

    def edit_policy(self) -> None:
        text = policy_text(self.installed)
        assert EXCLUDED in text
        edited = text.replace(EXCLUDED, EDITED)
        write_policy(self.installed.plane, edited)
        self.publish("policy", {"policy.yaml": edited.encode()})

    def upgrade_guard(self) -> None:
        apply_guard(self.installed, policy_text(self.installed), self.folder)

    def kill_one(self) -> None:
        self.kill(next(iter(self.running)))


@dataclass
class Create:
    event: str
    started: float
    gpu: bool
    ended: float = 0.0
    outcome: str = "answered"
    message: str = ""


class Creators:
    """Threads creating pods at ``rate`` a second, each create tagged with the event under way."""

    def __init__(self, installed: Installed, namespace: str, *, rate: float, threads: int = 4):
        self.installed, self.namespace, self.rate = installed, namespace, rate
        self.event = "steady"
        self.done: list[Create] = []
        self.windows: dict[str, tuple[float, float]] = {}
        self.examples: dict[str, str] = {}  # an event's first failed create: what it said
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._create, args=(n, threads), daemon=True)
            for n in range(threads)
        ]

    def __enter__(self) -> Creators:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def during(self, event: str, action: Callable[[], Any], settle: float) -> float:
        """Run ``action`` with creates tagged ``event``, then ``settle`` seconds more; its start."""
        self.event = event
        began = time.monotonic()
        action()
        time.sleep(settle)
        self.event = "steady"
        self.windows[event] = (began, time.monotonic())
        return began

    def _create(self, number: int, threads: int) -> None:
        core = client.CoreV1Api(api_client(self.installed.plane.kubeconfig))
        interval = threads / self.rate
        count = 0
        while not self._stop.is_set():
            count += 1
            gpu = count % 2 == 0
            name = f"c{number}-{count}-{'gpu' if gpu else 'cpu'}-{time.monotonic_ns() % 10**6}"
            body = pod_manifest(
                name, gpu_container(gpu="4" if gpu else None), labels={"gpu": str(gpu).lower()}
            )
            create = Create(self.event, time.monotonic(), gpu)
            try:
                core.create_namespaced_pod(self.namespace, body, _request_timeout=30)
            except ApiException as error:
                create.message = str(error.body)
                create.outcome = outcome(create.message)
            except (OSError, urllib3.exceptions.HTTPError) as error:  # the client's own timeout
                create.outcome, create.message = "timed out", str(error)
            create.ended = time.monotonic()
            with self._lock:
                self.done.append(create)
            self._stop.wait(max(0.0, interval - (create.ended - create.started)))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per event: creates attempted, refused, timed out, refused by the guard, failed
        otherwise, and the longest gap between two answers while the event lasted."""
        found: dict[str, dict[str, float]] = {}
        by_event: dict[str, list[Create]] = collections.defaultdict(list)
        for create in self.done:
            by_event[create.event].append(create)
        for event, creates in by_event.items():
            counts = collections.Counter(c.outcome for c in creates)
            row: dict[str, float] = {"attempted": len(creates)}
            for name in ("refused", "timed out", "refused by the guard", "failed otherwise"):
                row[name.replace(" ", "_")] = counts[name]
            if event in self.windows:
                row["longest_gap_s"] = round(self._longest_gap(*self.windows[event]), 2)
            found[event] = row
            failed = [c for c in creates if c.outcome != "answered"]
            if failed:
                began = self.windows.get(event, (failed[0].started, 0.0))[0]
                self.examples[event] = (
                    f"{failed[0].started - began:+.2f} s into it: {failed[0].message[:300]}"
                )
        return found

    def _longest_gap(self, began: float, ended: float) -> float:
        answers = sorted(c.ended for c in self.done if c.outcome == "answered")
        inside = [began, *(t for t in answers if began <= t <= ended), ended]
        return max(b - a for a, b in itertools.pairwise(inside))


def outcome(message: str) -> str:
    if GUARDED in message:
        return "refused by the guard"
    # NB: not "timeout": the URL of every failed call carries "?timeout=5s".
    if "deadline exceeded" in message or "Client.Timeout" in message:
        return "timed out"
    if "failed calling webhook" in message:
        return "refused"
    return "failed otherwise"


def unconfined(installed: Installed, namespace: str) -> list[str]:
    """GPU pods stored without the webhook's set-up."""
    core = client.CoreV1Api(installed.api)
    found = []
    for stored in core.list_namespaced_pod(namespace, label_selector="gpu=true").items:
        env = {e.name for c in stored.spec.containers for e in c.env or []}
        annotations = stored.metadata.annotations or {}
        if "CUDA_DEVICE_MEMORY_LIMIT" not in env or "gpushare-webhook.io/status" not in annotations:
            found.append(stored.metadata.name)
    return found


def dump(found: Any) -> str:
    return yaml.safe_dump(found, sort_keys=False)
