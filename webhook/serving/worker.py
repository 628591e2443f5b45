"""The buffering worker: gunicorn's gthread, with requests read whole before a thread sees them.

A client that connects and says nothing, stalls in the TLS handshake, or
sends its headers a byte at a time (slowloris) holds a file descriptor
until ``read_timeout`` runs out, never one of the few threads, so it cannot
starve the API server's requests. gunicorn 27 has no public hook that runs
before a request is parsed (its ``timeout`` is the worker heartbeat, its
server hooks see whole requests), so this rests on gthread's internals.
Every one it touches is listed in :data:`GUNICORN_INTERNALS`, and
tests/test_worker_contract.py fails by name if an upgrade changes one:

- ``ThreadWorker.enqueue_req(conn)``, overridden: every connection gthread
  would give its pool comes through it (new, kept alive, pipelined);
- ``ThreadWorker.murder_pending()``, overridden to count what it expires;
  it closes the connections of ``pending_conns`` (a deque sorted by
  ``conn.timeout``) whose deadline has passed and lowers ``nr_conns``;
- ``ThreadWorker.handle(conn)`` and ``finish_request(conn, future)``,
  called to answer a small review on the event loop itself;
- ``ThreadWorker.poller`` (a selector whose key data is called with the
  file object), ``pending_conns``, ``nr_conns``, ``cfg``, ``log``;
- ``ThreadWorker.keepalived_conns`` (a deque sorted by ``conn.timeout``) and
  ``on_client_socket_readable(conn, client)``, where a connection that has
  done its handshake waits for its first request, as kept-alive ones do;
- ``TConn``'s ``sock``, ``parser``, ``initialized``, ``data_ready``,
  ``timeout``, ``client``, ``set_timeout()`` and ``close()``;
- ``gunicorn.http.get_parser(cfg, source, source_addr)`` and the parser's
  ``unreader.take_buffered()`` / ``unread(data)``;
- ``gunicorn.sock.ssl_context(conf)``, which calls the ``ssl_context``
  setting's factory (webhook.serving.server sets it).

Only webhook.serving.server uses this module: the worker class is handed
to gunicorn through its ``worker_class`` setting.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import re
import socket
import ssl
import struct
import termios
import time
from collections.abc import Callable
from concurrent import futures
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn import sock as gsock
from gunicorn.workers.gthread import ThreadWorker

DEFAULT_READ_TIMEOUT = 10.0
# A request is read whole up to this size before a thread is involved; a
# larger body (real reviews are tens of KiB) is read by the thread, each read
# bounded by read_timeout. It caps what an idle slow client can make us hold.
BUFFER_LIMIT = 256 * 1024
# A review up to this size is answered on the event loop itself (see
# BufferingWorker.enqueue_req); its answer is small enough to fit the
# socket's buffers, so writing it does not wait on the client.
INLINE_LIMIT = 32 * 1024
HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d{1,12})[ \t]*\r\n", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r\n]*chunked", re.IGNORECASE)
TLS_HANDSHAKE_RECORD = 0x16
_PLAIN_HTTP_TEXT = b"This port speaks HTTPS only: send the request to https://.\n"
PLAIN_HTTP_ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_PLAIN_HTTP_TEXT), _PLAIN_HTTP_TEXT)
)

# What this module relies on, as (where, name, the parameters it must take
# or None for an attribute); checked against the installed gunicorn by
# tests/test_worker_contract.py.
GUNICORN_INTERNALS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("gunicorn.workers.gthread.ThreadWorker", "enqueue_req", ("self", "conn")),
    ("gunicorn.workers.gthread.ThreadWorker", "murder_pending", ("self",)),
    ("gunicorn.workers.gthread.ThreadWorker", "handle", ("self", "conn")),
    ("gunicorn.workers.gthread.ThreadWorker", "finish_request", ("self", "conn", "fs")),
    ("gunicorn.workers.gthread.ThreadWorker", "pending_conns", None),
    ("gunicorn.workers.gthread.ThreadWorker", "keepalived_conns", None),
    ("gunicorn.workers.gthread.ThreadWorker", "on_client_socket_readable", ("self", "conn")),
    ("gunicorn.workers.gthread.TConn", "set_timeout", ("self",)),
    ("gunicorn.workers.gthread.ThreadWorker", "nr_conns", None),
    ("gunicorn.workers.gthread.ThreadWorker", "poller", None),
    ("gunicorn.workers.gthread.TConn", "sock", None),
    ("gunicorn.workers.gthread.TConn", "parser", None),
    ("gunicorn.workers.gthread.TConn", "initialized", None),
    ("gunicorn.workers.gthread.TConn", "data_ready", None),
    ("gunicorn.workers.gthread.TConn", "timeout", None),
    ("gunicorn.workers.gthread.TConn", "client", None),
    ("gunicorn.workers.gthread.TConn", "close", ("self", "graceful")),
    ("gunicorn.http.unreader.Unreader", "take_buffered", ("self",)),
    ("gunicorn.http.unreader.Unreader", "unread", ("self", "data")),
    ("gunicorn.http", "get_parser", ("cfg", "source", "source_addr")),
    ("gunicorn.sock", "ssl_context", ("conf",)),
)


class BoundedSSLSocket(ssl.SSLSocket):
    """An SSLSocket on which "blocking" means "blocking for at most ``io_timeout``".

    gthread puts a connection's socket in blocking mode before a thread uses
    it; without a timeout, a client that stops sending halfway through a large
    body would hold that thread for good. ``SSLContext.sslsocket_class`` makes
    every served connection one of these.
    """

    io_timeout: float = DEFAULT_READ_TIMEOUT
    _held: bytearray | None = None

    def setblocking(self, flag: bool) -> None:
        if flag:
            self.settimeout(self.io_timeout)
        else:
            super().setblocking(False)

    def hold(self) -> None:
        """Collect what is sent until :meth:`release`: one TLS record, one write.

        gunicorn writes a response's head and body separately; held together
        they cost one encryption and one system call instead of two.
        """
        self._held = bytearray()

    def release(self) -> None:
        held, self._held = self._held, None
        if held:
            super().sendall(held)

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self._held is not None:
            self._held += data
        else:
            super().sendall(data, flags)


def bounded_socket_class(timeout: float) -> type[BoundedSSLSocket]:
    return type("BoundedSSLSocket", (BoundedSSLSocket,), {"io_timeout": timeout})


class _Reading:
    """What the event loop knows of a request it is still reading."""

    __slots__ = ("buf", "cut", "need", "searched", "tls")

    def __init__(self, data: bytes, tls: bool) -> None:
        self.buf = bytearray(data)
        self.need = -1  # total bytes of the request, once the head is in
        self.searched = 0  # bytes already searched for the end of the head
        self.tls = tls  # True once the handshake is done (or not needed)
        self.cut = ""  # why the connection is to be closed, when it is worth counting


class BufferingWorker(ThreadWorker):  # type: ignore[misc]
    """gthread, but a thread only ever gets a request that has arrived whole.

    Every connection that gthread would hand to its thread pool (new,
    kept-alive and readable again, or with pipelined bytes left over) comes
    through :meth:`enqueue_req`; until its request is in, it waits in
    gthread's pending list, on the poller, with a deadline of
    ``read_timeout``, and :meth:`_progress` advances the TLS handshake and
    the reading whenever its socket is readable. gthread's own expiry of
    pending connections closes the ones that run out of time.
    """

    read_timeout: float = DEFAULT_READ_TIMEOUT
    on_cut: Callable[[str, int], None] | None = None

    _inside = False

    def _cut(self, reason: str, count: int = 1) -> None:
        if self.on_cut is not None:
            try:
                self.on_cut(reason, count)
            except Exception:  # counting must never take the event loop down
                self.log.exception("counting a closed connection failed")

    def murder_pending(self) -> None:
        now = time.monotonic()
        expired = 0
        for conn in self.pending_conns:  # sorted by deadline
            if conn.timeout > now:
                break
            expired += 1
        super().murder_pending()
        if expired:
            self._cut("read-timeout", expired)

    def enqueue_req(self, conn: Any) -> None:
        if getattr(conn, "whole", False):
            conn.whole = False
            if conn.small and not self._inside and not _unsent(conn.sock):
                self._answer_here(conn)
            else:
                super().enqueue_req(conn)
            return
        left = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        tls = conn.initialized or getattr(conn, "handshaken", False) or not self.cfg.is_ssl
        conn.reading = _Reading(left, tls=tls)
        conn.sock.setblocking(False)
        conn.timeout = time.monotonic() + self.read_timeout
        self.pending_conns.append(conn)
        self._advance(conn)

    def _answer_here(self, conn: Any) -> None:
        """Answer a small, whole review on this thread, the event loop's.

        Admission is pure CPU: handing it to a pool thread only adds a
        GIL handoff and a wake-up pipe write per request, which cost more
        than the work on two cores (see docs/design.md, "Performance"). Anything
        else (/readyz does a TLS handshake of its own, large bodies, a
        client with an answer still unsent) goes to the pool.
        """
        # While inside, a pipelined next request (which finish_request picks
        # up at once) goes to the pool: the loop never recurses into itself.
        self._inside = True
        sock = conn.sock
        held = isinstance(sock, BoundedSSLSocket)
        try:
            if held:
                sock.hold()
            done: futures.Future[Any] = futures.Future()
            keep = False
            try:
                keep = self.handle(conn)
            finally:
                if held:
                    keep = self._release(sock) and keep
            done.set_result(keep)
            self.finish_request(conn, done)
        finally:
            self._inside = False

    def _release(self, sock: BoundedSSLSocket) -> bool:
        """Send what the answer held back; False when the client is gone."""
        try:
            sock.release()
        except OSError as error:  # ssl.SSLError too: reset, closed, timed out
            self.log.debug("answer not sent: %s", error)
            return False
        return True

    def _on_readable(self, conn: Any, _fileobj: Any) -> None:
        self.poller.unregister(conn.sock)
        self._advance(conn)

    def _advance(self, conn: Any) -> None:
        try:
            whole = self._progress(conn)
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            self.log.debug("closing connection from %s: %s", conn.client, error)
            self._cut("tls-handshake" if isinstance(error, ssl.SSLError) else "incomplete")
            self._drop(conn)
            return
        if whole is None:
            if conn.reading.cut:
                self._cut(conn.reading.cut)
            self._drop(conn)
        elif whole:
            self.pending_conns.remove(conn)
            self._hand_over(conn)
        elif conn.reading.tls and not conn.reading.buf and self.alive:
            self._keep_idle(conn)
        else:
            self.poller.register(conn.sock, 1, partial(self._on_readable, conn))

    def _keep_idle(self, conn: Any) -> None:
        """A connection past its handshake, with no request yet: idle, as a kept-alive one.

        HTTP clients dial ahead and pool what they did not use (Go's does):
        cut at ``read_timeout``, such a connection would close under the
        client's first call on it. It waits as gthread's kept-alive
        connections do, for the idle timeout; its request, once a byte of
        it comes, has ``read_timeout`` again.
        """
        self.pending_conns.remove(conn)
        conn.handshaken = True
        conn.set_timeout()  # now + the idle (keep-alive) timeout
        self.keepalived_conns.append(conn)
        self.poller.register(conn.sock, 1, partial(self.on_client_socket_readable, conn))

    def _progress(self, conn: Any) -> bool | None:
        """Read what is there without blocking: True when whole, None to close."""
        reading: _Reading = conn.reading
        if not reading.tls:
            if not isinstance(conn.sock, ssl.SSLSocket):
                try:
                    first = conn.sock.recv(1, socket.MSG_PEEK)
                except BlockingIOError:
                    return False
                if not first:
                    return None
                if first[0] != TLS_HANDSHAKE_RECORD:
                    reading.cut = "not-tls"
                    if first.isalpha():  # "POST ...": plain HTTP to the TLS port
                        reading.cut = "plain-http"
                        _answer_plain_http(conn.sock)
                    return None
                conn.sock = gsock.ssl_context(self.cfg).wrap_socket(
                    conn.sock,
                    server_side=True,
                    suppress_ragged_eofs=self.cfg.suppress_ragged_eofs,
                    do_handshake_on_connect=False,
                )
            try:
                conn.sock.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return False
            reading.tls = True
        if reading.buf and self._whole(reading):
            return True  # pipelined: the next request was read along with the last
        while True:
            try:
                data = conn.sock.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return False
            if not data:
                # The client went away: idle, as kept-alive clients do, or
                # halfway through a request, which is worth counting.
                reading.cut = "incomplete" if reading.buf else ""
                return None
            reading.buf += data
            if self._whole(reading):
                return True

    @staticmethod
    def _whole(reading: _Reading) -> bool:
        buf = reading.buf
        if len(buf) >= BUFFER_LIMIT:
            return True  # the thread reads the rest, or the parser refuses the head
        if reading.need < 0:
            # Search only what is new (and the 3 bytes before it): a head sent
            # a byte at a time must not cost a scan of all of it per byte.
            end = buf.find(HEAD_END, max(0, reading.searched - 3))
            if end < 0:
                reading.searched = len(buf)
                return False
            head = bytes(buf[: end + 2])
            length = _CONTENT_LENGTH.search(head)
            if length is not None:
                reading.need = end + len(HEAD_END) + int(length.group(1))
                if reading.need > BUFFER_LIMIT:
                    return True  # too large to hold here: the app refuses it or reads it
            elif _CHUNKED.search(head):
                # The end of a chunked body is a zero chunk; a chunk that
                # merely looks like one at a read boundary makes the thread
                # read the rest itself, still within read_timeout per read.
                return buf.endswith(b"0\r\n\r\n")
            else:
                return True
        return len(buf) >= reading.need

    def _hand_over(self, conn: Any) -> None:
        data = bytes(conn.reading.buf)
        conn.small = len(data) <= INLINE_LIMIT and data.startswith(b"POST /mutate ")
        conn.reading = None
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
            conn.initialized = True
        conn.parser.unreader.unread(data)
        conn.data_ready = True
        conn.whole = True
        self.enqueue_req(conn)

    def _drop(self, conn: Any) -> None:
        with contextlib.suppress(ValueError):  # not pending yet, or no longer
            self.pending_conns.remove(conn)
        self.nr_conns -= 1
        try:
            conn.close()
        except OSError as error:
            if error.errno not in (errno.ENOTCONN, errno.EBADF):
                self.log.debug("closing connection from %s: %s", conn.client, error)


def buffering_worker(
    read_timeout: float, on_cut: Callable[[str, int], None] | None = None
) -> type[BufferingWorker]:
    return type(
        "BufferingWorker",
        (BufferingWorker,),
        # staticmethod: a plain function stored on a class would become a method.
        {"read_timeout": read_timeout, "on_cut": staticmethod(on_cut) if on_cut else None},
    )


def _answer_plain_http(raw: socket.socket) -> None:
    """Say in plain text that this is a TLS port, as Go's servers do.

    What the client already sent is read first: closing a socket with
    unread bytes sends a reset, which can destroy the answer in flight.
    """
    try:
        for _ in range(16):
            if not raw.recv(65536):
                break
    except BlockingIOError:
        pass
    raw.send(PLAIN_HTTP_ANSWER)
    raw.shutdown(socket.SHUT_WR)


def _unsent(sock: socket.socket) -> int:
    """Bytes this socket has not yet got out to its peer (Linux TIOCOUTQ), 0 if unknown."""
    try:
        (count,) = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))
    except (OSError, ValueError):
        return 0
    return int(count)
