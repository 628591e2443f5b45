"""Transport abuse on loopback: slow, idle, half-open, plain-HTTP and crowds of clients.

The server under test runs with fewer threads (2 workers x 2) than there are
abusive connections, so the only way the honest request gets through is
that a stalled connection holds no thread. The read timeout is short so the
tests can also see the stalled connections being cut.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server, free_port, start_server, stop_server
from tests.helpers import apply, container, decode_patch, env_of, pod, review
from webhook import tls

READ_TIMEOUT = 4.0
THREADS = 2 * 2


@pytest.fixture(scope="module")
def tight(pki: tls.Issued, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("transport") / "server.log"
    running = start_server(
        [
            "--cert",
            str(pki.cert),
            "--key",
            str(pki.key),
            "--workers",
            "2",
            "--threads",
            "2",
            "--read-timeout",
            str(READ_TIMEOUT),
        ],
        ca=pki.ca,
        log=log,
        port=free_port(),
    )
    yield running
    stop_server(running)


def honest_review(server: Server, gpu: str = "4") -> dict[str, object]:
    return server.ask(pod(container(gpu=gpu)))


def raw_tls(server: Server) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return server.context().wrap_socket(raw, server_hostname="localhost")


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server closes ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except (ConnectionResetError, ssl.SSLError):
        return True


@contextlib.contextmanager
def abusers(server: Server, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections of each kind of stall, held open while the body runs."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            # Connects and never says a word.
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=30))
            # Starts a TLS handshake and stops after half a ClientHello.
            half = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            half.sendall(b"\x16\x03\x01\x02\x00\x01")
            socks.append(half)
            # Finishes TLS, then sends half a request head (slowloris).
            slow = raw_tls(server)
            slow.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nX-a: ")
            socks.append(slow)
            # Sends a whole head and a tenth of the body it announced.
            body = raw_tls(server)
            body.sendall(
                b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{" + b" " * 99
            )
            socks.append(body)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def test_stalled_connections_hold_no_thread(tight: Server) -> None:
    with abusers(tight, count=3 * THREADS) as socks:
        started = time.monotonic()
        for _ in range(5):
            assert honest_review(tight)["allowed"] is True
        elapsed = time.monotonic() - started
        # Served while every abuser was still connected: none had been cut yet.
        assert elapsed < READ_TIMEOUT / 2, f"honest requests took {elapsed:.1f}s"
        assert not closed_by_server(socks[2], within=0.01)


def test_slowloris_trickle_is_cut_at_the_read_timeout(tight: Server) -> None:
    slow = raw_tls(tight)
    slow.sendall(b"POST /mutate HTTP/1.1\r\n")
    started = time.monotonic()
    try:
        for _ in range(int(READ_TIMEOUT * 4)):
            # One header byte every quarter second: each read succeeds, the whole does not.
            try:
                slow.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                break
            time.sleep(0.25)
            assert honest_review(tight)["allowed"] is True
        assert closed_by_server(slow, within=2.0)
        assert time.monotonic() - started < READ_TIMEOUT + 2.0
    finally:
        slow.close()


@pytest.mark.parametrize(
    "stall",
    [
        pytest.param(b"", id="silent"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01", id="half-handshake"),
    ],
)
def test_silent_and_half_handshake_connections_are_cut(tight: Server, stall: bytes) -> None:
    with socket.create_connection(("127.0.0.1", tight.port), timeout=30) as sock:
        sock.sendall(stall)
        assert closed_by_server(sock, within=READ_TIMEOUT + 2.0)


def test_a_connection_dialled_ahead_is_kept_idle_past_the_read_timeout(tight: Server) -> None:
    """Go's client pools a connection it dialled and did not use yet: the server must not close
    it at --read-timeout, or the client's first call on it races the close."""
    with raw_tls(tight) as sock:  # the handshake is done; no request yet
        assert not closed_by_server(sock, within=READ_TIMEOUT + 1.0)
        body = json.dumps(review(pod(container(gpu="4")))).encode()
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_plain_http_to_the_tls_port_gets_a_plain_400(tight: Server) -> None:
    with socket.create_connection(("127.0.0.1", tight.port), timeout=10) as sock:
        sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"HTTPS only" in answer


def test_bytes_that_are_neither_tls_nor_http_are_closed(tight: Server) -> None:
    with socket.create_connection(("127.0.0.1", tight.port), timeout=10) as sock:
        sock.sendall(b"\x00\xff\x13\x37" * 16)
        assert closed_by_server(sock, within=2.0)
    assert honest_review(tight)["allowed"] is True


def test_pipelined_requests_on_one_connection_are_all_answered(tight: Server) -> None:
    one = json.dumps(review(pod(container(gpu="2")))).encode()
    head = (
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(one)
    )
    with raw_tls(tight) as sock:
        sock.sendall((head + one) * 3)
        seen = b""
        deadline = time.monotonic() + 10
        while seen.count(b"HTTP/1.1 200") < 3 and time.monotonic() < deadline:
            seen += sock.recv(65536)
    assert seen.count(b"HTTP/1.1 200") == 3


def test_chunked_and_large_bodies_are_read_whole(tight: Server) -> None:
    # A pod with ~1 MiB of env: past what the event loop buffers, read by the thread.
    big = container(gpu="4")
    big["env"] = [{"name": f"V{i}", "value": "x" * 1000} for i in range(1000)]
    body = json.dumps(review(pod(big))).encode()
    assert len(body) > 1000 * 1000
    status, answer = tight.request("POST", "/mutate", body, {"Content-Type": "application/json"})
    assert status == 200
    assert json.loads(answer)["response"]["allowed"] is True

    small = json.dumps(review(pod(container(gpu="4")))).encode()
    with raw_tls(tight) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + b"%x\r\n%s\r\n" % (len(small[:100]), small[:100])
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(small[100:]), small[100:])
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"allowed": true' in answer or b'"allowed":true' in answer


def test_a_crowd_of_concurrent_clients_all_get_right_answers(tight: Server) -> None:
    failures: list[str] = []

    def client(index: int) -> None:
        try:
            conn = tight.connect()
            for round_ in range(4):
                gpu = str(1 + (index + round_) % 8)
                obj = pod(container(gpu=gpu))
                conn.request(
                    "POST",
                    "/mutate",
                    json.dumps(review(obj)).encode(),
                    {"Content-Type": "application/json"},
                )
                response = json.loads(conn.getresponse().read())["response"]
                out = apply(obj, decode_patch(response))
                env = env_of(out["spec"]["containers"][0])
                if env.get("CUDA_DEVICE_MEMORY_LIMIT") != f"{int(gpu) * 1024}m":
                    failures.append(f"client {index}: wrong limit for {gpu} GiB: {env}")
            conn.close()
        except Exception as error:  # any failure is the test's finding
            failures.append(f"client {index}: {error!r}")

    workers = [threading.Thread(target=client, args=(i,)) for i in range(48)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert failures == []


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({"Content-Type": "text/plain"}, 415, id="text-plain"),
        pytest.param({"Content-Type": "application/x-www-form-urlencoded"}, 415, id="form"),
        pytest.param({}, 415, id="none"),
        pytest.param({"Content-Type": "application/json; charset=utf-8"}, 200, id="json-charset"),
    ],
)
def test_content_types_over_https(tight: Server, headers: dict[str, str], status: int) -> None:
    body = json.dumps(review(pod(container(gpu="1")))).encode()
    got, answer = tight.request("POST", "/mutate", body, headers)
    assert got == status, answer
    if status != 200:
        assert b"application/json" in answer  # the error says what to send


def test_a_client_that_pipelines_and_never_reads_blocks_nobody(tight: Server) -> None:
    one = json.dumps(review(pod(*(container(f"c{i}", gpu="1") for i in range(4))))).encode()
    head = (
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(one)
    )
    greedy = raw_tls(tight)
    try:
        greedy.settimeout(5)
        for _ in range(60):  # 60 requests at once, a few MB of answers, none read
            greedy.sendall((head + one) * 10)
    except (TimeoutError, ssl.SSLError, OSError):
        pass  # the server stopped reading from it: that is its right
    try:
        started = time.monotonic()
        for _ in range(5):
            assert honest_review(tight)["allowed"] is True
        assert time.monotonic() - started < READ_TIMEOUT / 2
    finally:
        greedy.close()


def test_a_chunked_body_past_the_limit_is_413(tight: Server) -> None:
    chunk = b"x" * (1024 * 1024)
    with raw_tls(tight) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        answer = b""
        try:
            for _ in range(8):  # 8 MiB, past the 7 MiB limit
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass  # the server may answer and close before the last chunk
        while chunk_in := sock.recv(65536):
            answer += chunk_in
            if b"\r\n\r\n" in answer and b"}" in answer:
                break
    assert answer.startswith(b"HTTP/1.1 413")
    assert b"larger than" in answer


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"POST /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", id="long-line"),
        pytest.param(
            b"POST /mutate HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", id="long-field"
        ),
        pytest.param(
            b"POST /mutate HTTP/1.1\r\n"
            + b"".join(b"X-%d: 1\r\n" % i for i in range(60))
            + b"\r\n",
            id="many-fields",
        ),
    ],
)
def test_oversized_heads_are_refused(tight: Server, head: bytes) -> None:
    with raw_tls(tight) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert status in (400, 414, 431), answer[:200]


def test_cut_connections_are_counted_by_reason(tight: Server) -> None:
    # Runs after the tests above: they cut connections of every kind.
    counted = tight.metrics()
    for reason in ("read-timeout", "plain-http", "not-tls"):
        assert counted.get(f'gpushare_connections_cut_total{{reason="{reason}"}}', 0) >= 1, counted


def test_log_names_nothing_alarming(tight: Server) -> None:
    # Last in the module: it reads what every test above made the server log.
    text = Path(tight.log).read_text()
    assert "Traceback" not in text
    assert "Socket error" not in text
