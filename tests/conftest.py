"""Session fixtures: a CA and serving pair made by the project, and one real server."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests import gotools
from tests.helpers import MUTATION, review
from webhook import tls

if MUTATION:
    # A mutant is killed or not the same way on every run: no random draws,
    # no examples remembered from a run over another mutant.
    settings.register_profile("mutation", derandomize=True, database=None)
    settings.load_profile("mutation")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the Go programs the collected tests use (helm, promtool) before the first test.

    A cold build takes minutes: no test's timeout should pay for it. A
    program that cannot be built is the fixture's to report (a skip, or a
    failure in CI).
    """
    wanted = {
        name
        for item in session.items
        for name in getattr(item, "fixturenames", ())
        if name in gotools.TOOLS
    }
    for name in sorted(wanted):
        with contextlib.suppress(gotools.Unavailable):
            gotools.tool(name)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tls.Issued:
    return tls.ensure_certificates(
        tmp_path_factory.mktemp("pki"), dns_names=["localhost"], ips=["127.0.0.1"]
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    ca: Path
    log: Path
    host: str = "localhost"

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_exc: object) -> None:
        stop_server(self)

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context(), timeout=10)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        conn = self.connect()
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def ask(self, obj: dict[str, Any], **review_fields: str) -> dict[str, Any]:
        """POST ``obj`` in an AdmissionReview; the response, after checking it is HTTP 200."""
        body = json.dumps(review(obj, **review_fields)).encode()
        status, answer = self.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        assert status == 200, answer
        response: dict[str, Any] = json.loads(answer)["response"]
        return response

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, by name with its labels: ``name{label="v"}``."""
        status, body = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values


def start_server(
    args: list[str],
    *,
    ca: Path,
    log: Path,
    port: int,
    env: dict[str, str] | None = None,
    host: str = "localhost",
) -> Server:
    # A test's server stops at once on SIGTERM; tests/test_drain.py tests the drain.
    drain = [] if "--drain" in args else ["--drain", "0"]
    with log.open("ab") as handle:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook",
                "serve",
                "--bind",
                f"127.0.0.1:{port}",
                *drain,
                *args,
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    server = Server(process, port, ca, log, host)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log.read_text()}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if server.request("GET", "/readyz")[0] == 200:
                return server
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server did not become ready:\n{log.read_text()}")


def start_watching(
    pki: tls.Issued, kubeconfig: Path, log: Path, *extra: str, workers: int = 2
) -> Server:
    """``serve --watch-nodes`` against the API server of ``kubeconfig``."""
    return start_server(
        [
            *("--cert", str(pki.cert), "--key", str(pki.key), "--workers", str(workers)),
            *("--watch-nodes", "--kubeconfig", str(kubeconfig), *extra),
        ],
        ca=pki.ca,
        log=log,
        port=free_port(),
    )


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="session")
def server(pki: tls.Issued, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real ``gpushare-webhook serve`` for the session, with the project's own certificates."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    running = start_server(
        ["--cert", str(pki.cert), "--key", str(pki.key), "--workers", "2"],
        ca=pki.ca,
        log=log,
        port=free_port(),
    )
    yield running
    stop_server(running)
