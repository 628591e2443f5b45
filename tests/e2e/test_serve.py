"""The real thing: ``gpushare-webhook serve`` as a process, over HTTPS verified by its CA."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import signal
import socket
import ssl
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import Server, free_port, start_server, stop_server
from tests.helpers import apply, container, decode_patch, env_of, pod, review


def test_mutates_a_gpu_pod_over_https(server: Server) -> None:
    obj = pod(container(gpu="4"), container("web"))
    status, body = server.request(
        "POST", "/mutate", json.dumps(review(obj)).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200
    answer = json.loads(body)
    assert answer["response"]["uid"] == review(obj)["request"]["uid"]
    out = apply(obj, decode_patch(answer["response"]))
    env = env_of(out["spec"]["containers"][0])
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "4096m"
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"


def test_keep_alive_connection_serves_many_reviews(server: Server) -> None:
    conn = server.connect()
    try:
        for size in ("1", "99", "0.5"):
            conn.request(
                "POST",
                "/mutate",
                json.dumps(review(pod(container(gpu=size)))).encode(),
                {"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            assert resp.status == 200
            assert resp.getheader("Connection", "keep-alive").lower() != "close"
            answer = json.loads(resp.read())["response"]
            assert answer["allowed"] is (size == "1")
    finally:
        conn.close()


def test_bad_body_is_400_over_https(server: Server) -> None:
    status, body = server.request("POST", "/mutate", b"{nope", {"Content-Type": "application/json"})
    assert status == 400
    assert "not valid JSON" in json.loads(body)["error"]


def test_oversized_body_is_413_before_it_is_read(server: Server) -> None:
    conn = server.connect()
    try:
        conn.putrequest("POST", "/mutate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(64 * 1024 * 1024))
        conn.endheaders()
        conn.send(b"{" * 1024)  # nowhere near the declared length
        resp = conn.getresponse()
        assert resp.status == 413
    finally:
        conn.close()


def test_certificate_is_verified_against_the_project_ca(server: Server) -> None:
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        server.context().wrap_socket(raw, server_hostname="localhost") as tls_sock,
    ):
        assert tls_sock.version() in ("TLSv1.2", "TLSv1.3")
    untrusting = ssl.create_default_context()
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        untrusting.wrap_socket(raw, server_hostname="localhost")


def test_tls_below_1_2_is_refused(server: Server) -> None:
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname = False
    old.verify_mode = ssl.CERT_NONE
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # offering them is the point
            old.minimum_version = ssl.TLSVersion.TLSv1
            old.maximum_version = ssl.TLSVersion.TLSv1_1
        old.set_ciphers("ALL:@SECLEVEL=0")
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        pytest.raises((ssl.SSLError, ConnectionResetError)),
    ):
        old.wrap_socket(raw, server_hostname="localhost")


def test_dev_certificate_is_made_once_and_reused(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    port = free_port()
    log = tmp_path / "dev.log"
    with start_server(
        ["--certs-dir", str(certs)], ca=certs / "ca.crt", log=log, port=port
    ) as running:
        assert running.request("GET", "/healthz")[0] == 200
    text = log.read_text()
    assert f"CA: {certs}/ca.crt" in text
    assert f"curl --cacert {certs}/ca.crt https://localhost:{port}/healthz" in text
    first = (certs / "tls.crt").read_bytes()
    assert oct((certs / "tls.key").stat().st_mode & 0o777) == "0o600"
    again = start_server(
        ["--certs-dir", str(certs)], ca=certs / "ca.crt", log=log, port=free_port()
    )
    stop_server(again)
    assert (certs / "tls.crt").read_bytes() == first
    assert "(reused)" in log.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "/nonexistent/policy.yaml"], "no such policy file"),
        (
            ["--cert", "/nonexistent/tls.crt", "--key", "/nonexistent/tls.key"],
            "cannot read certificate",
        ),
        (["--cert", "/nonexistent/tls.crt"], "give --cert and --key together"),
        (["--bind", "8443"], "expected HOST:PORT"),
        (["--bind", "127.0.0.1:70000"], "the port must be 1 to 65535"),
        (["--bind", "127.0.0.1:0"], "choose a port"),
        (["--bind", "no-such-host.invalid:8443"], "cannot resolve 'no-such-host.invalid'"),
        (["--workers", "0"], "argument --workers: '0': must be at least 1"),
        (["--threads", "many"], "argument --threads: 'many' is not a whole number"),
        (["--read-timeout", "0"], "argument --read-timeout: '0': must be more than 0 seconds"),
        (["--read-timeout", "nan"], "must be more than 0 seconds"),
        (["--node-selector", "gpu share"], "'gpu share' is not a label selector requirement"),
        (["--log-format", "yaml"], "argument --log-format: invalid choice: 'yaml'"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate (see gpushare-webhook --help)"),
    ],
)
def test_serve_refuses_to_start_with_a_clear_message(args: list[str], message: str) -> None:
    assert message in _serve_fails(*args)


def _serve_fails(*args: str) -> str:
    """Run serve, which must refuse to start: exit 2, one line.

    On a port of its own unless ``args`` bind one: a webhook already
    serving on the default port (README command 1) must not answer for it.
    """
    bind = [] if "--bind" in args else ["--bind", f"127.0.0.1:{free_port()}"]
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", *args, *bind],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def test_serve_refuses_a_port_another_program_listens_on() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert f"port {port} is already in use" in _serve_fails("--bind", f"127.0.0.1:{port}")


def test_a_second_serve_on_a_served_port_is_refused(server: Server, tmp_path: Path) -> None:
    """Its workers would share the port (SO_REUSEPORT), and the kernel split the requests."""
    message = _serve_fails("--bind", f"127.0.0.1:{server.port}", "--certs-dir", str(tmp_path))
    assert "already in use (by another program, or another gpushare-webhook serve)" in message
    assert not (tmp_path / "tls.crt").exists()  # refused before anything was made
    assert server.request("GET", "/healthz")[0] == 200


def test_serve_never_replaces_a_pair_made_for_another_server(tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "webhook", "certs", "create", "--out", str(tmp_path)],
        capture_output=True,
        check=True,
    )
    assert made.returncode == 0
    before = (tmp_path / "tls.crt").read_bytes()
    message = _serve_fails("--certs-dir", str(tmp_path), "--bind", f"127.0.0.1:{free_port()}")
    assert "is not a development certificate (it names gpushare-webhook," in message
    assert f"--cert {tmp_path}/tls.crt --key {tmp_path}/tls.key" in message
    assert (tmp_path / "tls.crt").read_bytes() == before


def test_serve_refuses_a_certs_dir_it_cannot_use(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    bind = ["--bind", f"127.0.0.1:{free_port()}"]
    assert "is a file, not a directory" in _serve_fails("--certs-dir", str(file), *bind)
    under = str(file / "certs")
    assert "cannot be made" in _serve_fails("--certs-dir", under, *bind)


def test_serve_refuses_a_broken_policy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("gpuMemory: lots\n")
    assert "'gpuMemory': expected a positive whole number" in _serve_fails("--policy", str(policy))


def test_access_lines_only_with_access_log(server: Server, tmp_path: Path) -> None:
    assert server.request("GET", "/healthz")[0] == 200
    assert "GET /healthz HTTP/1.1" not in server.log.read_text()
    certs = tmp_path / "certs"
    log = tmp_path / "access.log"
    with start_server(
        ["--certs-dir", str(certs), "--access-log"], ca=certs / "ca.crt", log=log, port=free_port()
    ) as running:
        assert running.request("GET", "/healthz")[0] == 200
    assert "GET /healthz HTTP/1.1" in log.read_text()


def test_watch_nodes_without_credentials_stops_start_up(tmp_path: Path) -> None:
    # Not _serve_fails: the development certificate's lines come first, then the watch's.
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--watch-nodes",
         "--kubeconfig", str(tmp_path / "missing"), "--certs-dir", str(tmp_path),
         "--bind", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no usable Kubernetes credentials" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_start_up_lines_name_the_address(server: Server) -> None:
    text = server.log.read_text()
    assert f"Listening at: https://127.0.0.1:{server.port} (" in text
    assert f"https://127.0.0.1:{server.port}/mutate" in text


def test_serve_writes_text_logs_on_a_terminal(tmp_path: Path) -> None:
    """A person who runs serve reads lines, a collector (any pipe) JSON: the default, auto."""
    port = free_port()
    command = [sys.executable, "-m", "webhook", "serve", "--bind", f"127.0.0.1:{port}"]
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(tmp_path)
        os.execv(sys.executable, [*command, "--certs-dir", str(tmp_path / "certs")])
    seen = b""
    try:
        while b"Listening at" not in seen:
            chunk = os.read(fd, 4096)
            assert chunk, seen
            seen += chunk
    finally:
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(OSError):  # the terminal closes with the child
            while chunk := os.read(fd, 4096):
                seen += chunk
        os.waitpid(pid, 0)
        os.close(fd)
    text = seen.decode()
    assert f"INFO gpushare_webhook.serve serving url=https://127.0.0.1:{port}/mutate" in text
    assert "INFO gunicorn.error Listening at: https://127.0.0.1:" in text
    assert '{"time"' not in text
