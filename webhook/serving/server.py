"""Serving the app under gunicorn with TLS, configured in code.

Owns the gunicorn settings and the worker model, and hands gunicorn one
cached, self-reloading SSLContext per worker instead of the context gunicorn
would build (and re-read from disk) for every accepted connection. The
worker itself, and the gunicorn internals it rests on, are in
webhook.serving.worker; this module uses only gunicorn's public API
(BaseApplication, settings, the logger class).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger

from webhook.serving.context import ReloadingContext, server_context
from webhook.serving.drain import DEFAULT_DRAIN, DrainFlag, close_while_draining, draining_arbiter
from webhook.serving.worker import DEFAULT_READ_TIMEOUT, bounded_socket_class, buffering_worker

# gthread with SO_REUSEPORT: keep-alive connections from the apiserver are
# spread over the workers by the kernel instead of piling onto one; requests
# are read whole before a thread sees them (see bench/ and docs/design.md).
DEFAULT_WORKER_CLASS = "buffering"  # or gunicorn's own "gthread" and "sync", to compare
DEFAULT_WORKERS = 2
DEFAULT_THREADS = 4
# Connections one worker holds at once; past it, new ones wait in the backlog.
DEFAULT_WORKER_CONNECTIONS = 500
# Longer than the API server's webhook client keeps an idle connection
# (90 s): the client then always closes first. A server that closes first
# races the client's next call on that connection, which Go does not retry
# for a POST ("write: broken pipe", a failed create). docs/design.md, "Worker
# model and timeouts".
DEFAULT_IDLE_TIMEOUT = 120
# After the drain, in-flight calls get this long to finish (the manifests'
# terminationGracePeriodSeconds covers the drain and this).
GRACEFUL_TIMEOUT = 20


@dataclass(frozen=True)
class ServeOptions:
    bind: str = "0.0.0.0:8443"
    cert: Path = Path("certs/tls.crt")
    key: Path = Path("certs/tls.key")
    workers: int = DEFAULT_WORKERS
    threads: int = DEFAULT_THREADS
    worker_class: str = DEFAULT_WORKER_CLASS
    keepalive: int = DEFAULT_IDLE_TIMEOUT  # seconds a kept-alive connection may sit idle
    timeout: int = 30
    drain: float = DEFAULT_DRAIN  # seconds answered after SIGTERM (webhook.serving.drain)
    drain_flag: Path | None = None  # the file that says "draining" to the workers
    read_timeout: float = DEFAULT_READ_TIMEOUT  # connect (or first byte) to whole request
    worker_connections: int = DEFAULT_WORKER_CONNECTIONS
    # Told (reason, count) when the worker closes connections that sent no
    # whole request: "read-timeout", "plain-http", "not-tls", "tls-handshake",
    # "incomplete". For /metrics; called on the worker's event loop.
    on_connection_cut: Callable[[str, int], None] | None = None
    log_level: str = "info"
    access_log: bool = False
    log_config: dict[str, Any] | None = None  # a dictConfig for gunicorn's loggers too


class WebhookServer(BaseApplication):  # type: ignore[misc]
    """gunicorn, configured in code: no config file, no command-line parsing."""

    def __init__(self, app: Any, options: ServeOptions) -> None:
        self.application = app
        self.options = options
        self.contexts = ReloadingContext(options.cert, options.key)
        super().__init__()

    def load_config(self) -> None:
        o = self.options
        contexts = self.contexts

        socket_class = bounded_socket_class(o.read_timeout)

        def ssl_context(_conf: Any, _default_factory: Any) -> Any:
            context = contexts.get()
            context.sslsocket_class = socket_class
            return context

        gevent_contexts: list[Any] = []

        def gevent_ssl_context(_conf: Any, _default_factory: Any) -> Any:
            # For comparing worker models only: a context made after gevent
            # patched the ssl module, once per worker, not reloaded.
            if not gevent_contexts:
                gevent_contexts.append(server_context(o.cert, o.key))
            return gevent_contexts[0]

        settings: dict[str, Any] = {
            "bind": [o.bind],
            "workers": o.workers,
            "worker_class": (
                buffering_worker(o.read_timeout, o.on_connection_cut)
                if o.worker_class == "buffering"
                else o.worker_class
            ),
            "threads": o.threads,
            "certfile": str(o.cert),
            "keyfile": str(o.key),
            "ssl_context": gevent_ssl_context if o.worker_class == "gevent" else ssl_context,
            "reuse_port": True,
            "keepalive": o.keepalive,
            "timeout": o.timeout,
            "worker_connections": o.worker_connections,
            "graceful_timeout": GRACEFUL_TIMEOUT,
            "pre_request": close_while_draining(DrainFlag(o.drain_flag)) if o.drain_flag else None,
            "loglevel": o.log_level,
            "errorlog": "-",
            "accesslog": "-" if o.access_log else None,
            "logger_class": QuietAccessLogger,
            "logconfig_dict": o.log_config,
            "proc_name": "gpushare-webhook",
            # Requests are small JSON posts; refuse anything else early.
            "limit_request_line": 4094,
            "limit_request_fields": 50,
            "limit_request_field_size": 8190,
            # The heartbeat file lives in memory: the root filesystem is read-only.
            "worker_tmp_dir": "/dev/shm" if Path("/dev/shm").is_dir() else None,
            "control_socket_disable": True,
        }
        for key, value in settings.items():
            if value is not None and key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Any:
        return self.application

    def run(self) -> None:
        # gunicorn's BaseApplication.run, with the arbiter that drains on SIGTERM.
        flag = DrainFlag(self.options.drain_flag) if self.options.drain_flag else None
        try:
            draining_arbiter(self.options.drain, flag)(self).run()
        except RuntimeError as error:
            print(f"\nError: {error}\n", file=sys.stderr, flush=True)
            sys.exit(1)


class QuietAccessLogger(Logger):  # type: ignore[misc]
    """gunicorn's logger, minus the access line unless ``--access-log`` asks for it.

    Given a logging config, gunicorn builds every access line (its atoms,
    a formatted date) even when the access logger drops it: a few percent
    of a worker's time, for nothing.
    """

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.cfg.accesslog:
            super().access(resp, req, environ, request_time)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        # With reuse_port the workers bind, not the arbiter, whose
        # "Listening at: %s (%s)" line then names no address: name the URL.
        if msg.startswith("Listening at:") and args and not args[0]:
            args = (", ".join(f"https://{bind}" for bind in self.cfg.bind), *args[1:])
        super().info(msg, *args, **kwargs)
