"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

No scheduler and no kubelet: pods stay Pending, which is all admission
needs (the scheduling tier, tests/controlplane/scheduling.py, adds
kube-scheduler with ``start_scheduler``, and fake nodes). RBAC is on; the
API server signs service-account tokens (so the TokenRequest API works),
trusts one CA for client certificates (the admin credential is one, in
group ``system:masters``) and writes an audit log that records admission
annotations, and limits the critical priority classes to namespaces with a
quota for them, as GKE does. Each process is started in its own session
and stopped by its PID; the logs stay in ``root`` for a failed test to
show.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import free_port
from tests.controlplane import pki
from tests.controlplane.build import Binaries

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # Metadata is the least level that carries admission (and so webhook) annotations.
  - level: Metadata
    resources: [{group: "", resources: [pods, pods/ephemeralcontainers]}]
    verbs: [create, update, patch]
  # The order an uninstall deletes in (the webhook configuration first).
  - level: Metadata
    resources:
      - {group: admissionregistration.k8s.io, resources: [mutatingwebhookconfigurations]}
      - {group: apps, resources: [deployments]}
      - {group: "", resources: [services, secrets]}
    verbs: [delete]
  - level: None
"""

# As GKE configures it: a pod of a system-*-critical priority class may only be
# created in a namespace whose ResourceQuota names that class (the manifests
# ship one), so a quota missing from them shows here as it would there.
ADMISSION_CONFIG = """\
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - scopeName: PriorityClass
              operator: In
              values: [system-node-critical, system-cluster-critical]
"""


# Seconds a process has between SIGTERM and SIGKILL; the extender exits only on a second SIGTERM.
STOP_TIMEOUTS = {"gpushare-sche-extender": 2.0}


class ControlPlaneError(Exception):
    """A component did not start; the message ends with the tail of its log."""


class ControlPlane:
    def __init__(self, root: Path, binaries: Binaries) -> None:
        self.root = root
        self.binaries = binaries
        self.etcd_port, self.peer_port, self.port = free_port(), free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.audit_log = root / "audit.log"
        certs = root / "pki"
        self.authority = pki.Authority(certs)
        self.ca = self.authority.path
        self.serving = self.authority.issue(
            "kube-apiserver",
            server=True,
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        )
        self.admin = self.authority.issue("admin", organization="system:masters")
        self.sa_key, self.sa_pub = pki.service_account_keys(certs)
        (root / "audit-policy.yaml").write_text(AUDIT_POLICY)
        (root / "admission.yaml").write_text(ADMISSION_CONFIG)
        self.kubeconfig = self.write_kubeconfig(root / "admin.kubeconfig", user=self._admin_user())

    # -- credentials --

    def _admin_user(self) -> dict[str, str]:
        cert, key = self.admin
        return {
            "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(key.read_bytes()).decode(),
        }

    def write_kubeconfig(
        self, path: Path, *, user: dict[str, str], namespace: str = "default"
    ) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.authority.pem).decode(),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "test",
        }
        path.write_text(json.dumps(config, indent=2) + "\n")
        path.chmod(0o600)
        return path

    def token_kubeconfig(self, path: Path, token: str, *, namespace: str = "default") -> Path:
        return self.write_kubeconfig(path, user={"token": token}, namespace=namespace)

    # -- processes --

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.root / f"{name}.log").open("ab")
        with log:
            self.processes[name] = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={
                    **os.environ,
                    "NO_PROXY": "127.0.0.1,localhost",
                    "no_proxy": "127.0.0.1,localhost",
                    **(env or {}),
                },
            )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> None:
        try:
            self.start_etcd()
            self.start_apiserver()
            self.start_controller_manager()
        except BaseException:
            self.stop()
            raise

    def start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=test",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=test={peer}",
                # A test cluster lives minutes: durability is not worth an fsync per write.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: self._http(f"{client}/health", tls=False) is not None)

    def start_apiserver(self) -> None:
        cert, key = self.serving
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # The kubernetes Service's endpoints would be 127.0.0.1, which the
                # reconciler refuses; nothing here routes Services anyway.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.port}",
                f"--tls-cert-file={cert}",
                f"--tls-private-key-file={key}",
                f"--client-ca-file={self.ca}",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={self.sa_pub}",
                f"--service-account-signing-key-file={self.sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                f"--audit-policy-file={self.root / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking",
                f"--admission-control-config-file={self.root / 'admission.yaml'}",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", lambda: self._http(f"{self.url}/readyz") == b"ok", timeout=90)

    def start_controller_manager(self, *, client_limits: tuple[float, int] | None = None) -> None:
        """kube-controller-manager with every controller; ``client_limits`` (qps, burst) raise
        its client's requests a second above its defaults (20, burst 30)."""
        limits = (
            [f"--kube-api-qps={client_limits[0]:g}", f"--kube-api-burst={client_limits[1]}"]
            if client_limits
            else []
        )
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",  # serves nothing: the tests need its controllers only
                f"--root-ca-file={self.ca}",
                f"--service-account-private-key-file={self.sa_key}",
                "--controllers=*",
                *limits,
                "--v=1",
            ],
        )
        # The service-account controller making "default" is what lets pods be created.
        self._wait(
            "kube-controller-manager",
            lambda: (
                self._http(f"{self.url}/api/v1/namespaces/default/serviceaccounts/default")
                is not None
            ),
            timeout=60,
        )

    def start_scheduler(self, config: Path) -> None:
        """kube-scheduler with ``config`` (a KubeSchedulerConfiguration naming the admin
        kubeconfig, leader election off); ready when its /readyz says so (informers synced)."""
        port = free_port()
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--config={config}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.root / 'scheduler-certs'}",
                "--v=2",
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its own self-signed certificate

        def ready() -> bool:
            url = f"https://127.0.0.1:{port}/readyz"
            try:
                with urllib.request.urlopen(url, timeout=5, context=insecure) as response:
                    return bool(response.read() == b"ok")
            except (OSError, urllib.error.URLError):
                return False

        self._wait("kube-scheduler", ready, timeout=60)

    def stop_process(self, name: str, *, timeout: float = 20.0) -> None:
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        # What else was started (the scheduling tier's programs) first, then the control plane.
        core = ("kube-controller-manager", "kube-apiserver", "etcd")
        for name in [name for name in reversed(self.processes) if name not in core]:
            self.stop_process(name, timeout=STOP_TIMEOUTS.get(name, 20.0))
        for name in core:
            self.stop_process(name)

    def restart_apiserver(self) -> None:
        self.stop_process("kube-apiserver")
        self.start_apiserver()

    def _wait(self, name: str, ready: Any, *, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.processes[name]
            if process.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with {process.returncode}:\n{self.log_tail(name)}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not ready after {timeout:.0f} s:\n{self.log_tail(name)}")

    # -- talking to it --

    def context(self) -> ssl.SSLContext:
        """TLS to the API server as the admin."""
        context = ssl.create_default_context(cafile=str(self.ca))
        cert, key = self.admin
        context.load_cert_chain(str(cert), str(key))
        return context

    def _http(
        self,
        url: str,
        *,
        tls: bool = True,
        method: str = "GET",
        body: bytes | None = None,
        timeout: float = 5.0,
    ) -> bytes | None:
        """The body of a 2xx answer, or None for any failure (used while waiting)."""
        request = urllib.request.Request(url, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(
                request, timeout=timeout, context=self.context() if tls else None
            ) as response:
                data: bytes = response.read()
                return data
        except (OSError, urllib.error.URLError):
            return None

    def metrics(self) -> str:
        """The API server's own /metrics, read with the admin credential."""
        body = self._http(f"{self.url}/metrics", timeout=15)
        if body is None:
            raise ControlPlaneError("cannot read the API server's /metrics")
        return body.decode()

    def compact_etcd(self) -> int:
        """Compact etcd up to its current revision (through etcd's JSON gateway); the revision."""
        client = f"http://127.0.0.1:{self.etcd_port}"
        status = self._http(
            f"{client}/v3/kv/range", tls=False, method="POST", body=b'{"key":"AA=="}'
        )
        if status is None:
            raise ControlPlaneError("etcd did not answer a range request")
        revision = int(json.loads(status)["header"]["revision"])
        done = self._http(
            f"{client}/v3/kv/compaction",
            tls=False,
            method="POST",
            body=json.dumps({"revision": str(revision), "physical": True}).encode(),
        )
        if done is None:
            raise ControlPlaneError(f"etcd refused to compact at revision {revision}")
        return revision

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        kubeconfig: Path | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done


@contextlib.contextmanager
def running(root: Path, binaries: Binaries) -> Iterator[ControlPlane]:
    plane = ControlPlane(root, binaries)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
