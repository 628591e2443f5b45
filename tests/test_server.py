"""When the buffering worker deems a request whole: the one decision it makes itself."""

from __future__ import annotations

import pytest

from webhook.serving.worker import BUFFER_LIMIT, BufferingWorker, _Reading

HEAD = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def whole_after(request: bytes) -> int | None:
    """Feed ``request`` a byte at a time; how many bytes made it whole (None: never)."""
    reading = _Reading(b"", tls=True)
    for count in range(1, len(request) + 1):
        reading.buf += request[count - 1 : count]
        if BufferingWorker._whole(reading):
            return count
    return None


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        pytest.param(HEAD + b"Content-Length: 2\r\n\r\n{}", "end", id="content-length"),
        pytest.param(HEAD + b"content-length:   2 \r\n\r\n{}", "end", id="header-case-spacing"),
        pytest.param(HEAD + b"Content-Length: 0\r\n\r\n", "end", id="empty-body"),
        pytest.param(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", "end", id="no-body"),
        pytest.param(
            HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "end", id="chunked"
        ),
        pytest.param(HEAD + b"Content-Length: 5\r\n\r\n{}", None, id="body-short"),
        pytest.param(HEAD + b"X-Slow: aaaa", None, id="head-unfinished"),
    ],
)
def test_whole_exactly_when_the_last_byte_arrives(
    request_bytes: bytes, expected: str | None
) -> None:
    assert whole_after(request_bytes) == (len(request_bytes) if expected == "end" else None)


def test_a_body_too_large_to_buffer_is_handed_over_with_its_head() -> None:
    head = HEAD + b"Content-Length: %d\r\n\r\n" % (BUFFER_LIMIT + 1)
    assert whole_after(head) == len(head)


def test_a_head_that_never_ends_is_handed_over_at_the_buffer_limit() -> None:
    reading = _Reading(HEAD + b"X-Long: " + b"a" * BUFFER_LIMIT, tls=True)
    assert BufferingWorker._whole(reading)  # the parser then refuses it (431)
