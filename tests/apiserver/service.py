"""A home-made stand-in for a Service in front of webhook replicas, on loopback.

The tier has no kube-proxy and no pod network, and the API server's
webhook client can only be pointed at a URL: this TCP proxy does what a
Service does to a webhook's availability, and nothing more.

- Its endpoint list follows the replicas' readiness with a lag. Each
  replica's ``/readyz`` is probed every ``period`` seconds (as the kubelet's
  readiness probe, or a pod marked terminating, feeds the EndpointSlice),
  and a change takes effect ``lag`` seconds after it is seen (the
  EndpointSlice controller, then kube-proxy's next sync of its rules).
- A new connection goes to a routed endpoint, in turn, and stays with it
  for its whole life, as connection tracking keeps it; an endpoint that
  refuses the connection resets the client's, as a dead pod's address does.
- TLS passes through untouched: the API server checks the replicas' own
  certificate.

``opened`` counts the connections made to each replica.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import socket
import ssl
import struct
import threading
import time
from pathlib import Path


class Service:
    def __init__(self, ca: Path, *, lag: float, period: float = 0.2) -> None:
        self.lag, self.period = lag, period
        self.context = ssl.create_default_context(cafile=str(ca))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.opened: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()
        self._seen: dict[int, bool] = {}  # replica port: ready when last probed
        self._pending: list[tuple[float, int, bool]] = []  # (when, port, ready)
        self._routed: list[int] = []
        self._turn = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._accept, daemon=True),
            threading.Thread(target=self._probe, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def add(self, port: int) -> None:
        """A replica's address, routed once it is seen ready (and the lag has passed)."""
        with self._lock:
            self._seen.setdefault(port, False)

    def routed(self) -> list[int]:
        with self._lock:
            return list(self._routed)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _ready(self, port: int) -> bool:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=self.context, timeout=1)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _probe(self) -> None:
        while not self._stop.wait(self.period):
            with self._lock:
                ports = list(self._seen)
            for port in ports:
                ready = self._ready(port)
                with self._lock:
                    if ready != self._seen[port]:
                        self._seen[port] = ready
                        self._pending.append((time.monotonic() + self.lag, port, ready))
            self._apply_due()

    def _apply_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [change for change in self._pending if change[0] <= now]
            self._pending = [change for change in self._pending if change[0] > now]
            for _, port, ready in due:
                if ready and port not in self._routed:
                    self._routed.append(port)
                elif not ready and port in self._routed:
                    self._routed.remove(port)

    def _pick(self) -> int | None:
        with self._lock:
            if not self._routed:
                return None
            self._turn += 1
            return self._routed[self._turn % len(self._routed)]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        port = self._pick()
        try:
            if port is None:
                raise ConnectionRefusedError("no endpoints")
            upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self.opened[port] += 1
        pair = (client, upstream)
        for source, sink in (pair, pair[::-1]):
            threading.Thread(target=_pump, args=(source, sink, pair), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket, pair: tuple[socket.socket, ...]) -> None:
    """Copy one way until either side ends; then end both, a reset as a reset."""
    reset = False
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except ConnectionResetError:
        reset = True
    except OSError:
        pass
    for end in pair:
        if reset:
            _reset(end)
        else:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
