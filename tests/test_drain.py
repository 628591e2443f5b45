"""The drain: after SIGTERM the real server keeps answering, unready, then stops.

A real ``serve`` (gunicorn, TLS, the project's certificates) gets SIGTERM
while a client holds a kept-alive connection, as the API server does.
"""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import time
from pathlib import Path

import pytest

from tests.conftest import Server, free_port, start_server, stop_server
from tests.helpers import container, pod, review
from webhook import tls

DRAIN = 2.0


def _mutate(conn: http.client.HTTPSConnection) -> http.client.HTTPResponse:
    body = json.dumps(review(pod(container(gpu="4")))).encode()
    conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    return answer


@pytest.fixture
def draining(pki: tls.Issued, tmp_path: Path) -> Server:
    return start_server(
        ["--cert", str(pki.cert), "--key", str(pki.key), "--drain", str(DRAIN)],
        ca=pki.ca,
        log=tmp_path / "server.log",
        port=free_port(),
    )


def test_sigterm_fails_readiness_at_once_and_answers_until_the_drain_ends(
    draining: Server,
) -> None:
    kept = draining.connect()
    try:
        assert _mutate(kept).getheader("Connection") == "keep-alive"
        draining.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        while draining.request("GET", "/readyz")[0] == 200:
            assert time.monotonic() - signalled < 1.0, "readiness still passes after SIGTERM"
            time.sleep(0.02)
        status, body = draining.request("GET", "/readyz")
        assert status == 503
        assert b"draining" in body
        # The kept-alive connection is answered, and told to close: the
        # client's next call dials again, through an updated Service.
        answer = _mutate(kept)
        assert answer.status == 200
        assert answer.getheader("Connection") == "close"
        answered = 0
        while time.monotonic() - signalled < DRAIN - 0.5:
            assert _mutate(draining.connect()).status == 200  # new connections too
            answered += 1
        assert answered > 0
        assert draining.process.wait(timeout=DRAIN + 15) == 0
        stopped = time.monotonic() - signalled
        assert stopped >= DRAIN, f"stopped {stopped:.1f}s after SIGTERM, before the drain ended"
    finally:
        kept.close()
        stop_server(draining)
    with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
        draining.request("GET", "/healthz")
    log = draining.log.read_text()
    assert "draining: readiness fails" in log
    assert "Traceback" not in log


def test_a_second_sigterm_stops_at_once(draining: Server) -> None:
    draining.process.send_signal(signal.SIGTERM)
    while draining.request("GET", "/readyz")[0] == 200:
        time.sleep(0.02)
    signalled = time.monotonic()
    draining.process.send_signal(signal.SIGTERM)
    assert draining.process.wait(timeout=15) == 0
    assert time.monotonic() - signalled < DRAIN
