"""Serving the app under gunicorn with TLS: the only module that imports gunicorn.

Owns the worker model and its settings, and hands gunicorn one cached,
self-reloading SSLContext per worker instead of the context gunicorn would
build (and re-read from disk) for every accepted connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication

from webhook.tls import ReloadingContext

# gthread with SO_REUSEPORT: keep-alive connections from the apiserver are
# spread over the workers by the kernel instead of piling onto one, and a
# slow client ties up one connection, not a worker (see bench/ and README).
DEFAULT_WORKER_CLASS = "gthread"
DEFAULT_WORKERS = 2
DEFAULT_THREADS = 4


@dataclass(frozen=True)
class ServeOptions:
    bind: str = "0.0.0.0:8443"
    cert: Path = Path("certs/tls.crt")
    key: Path = Path("certs/tls.key")
    workers: int = DEFAULT_WORKERS
    threads: int = DEFAULT_THREADS
    worker_class: str = DEFAULT_WORKER_CLASS
    keepalive: int = 30
    timeout: int = 30
    log_level: str = "info"
    access_log: bool = False
    log_config: dict[str, Any] | None = None  # a dictConfig for gunicorn's loggers too


class WebhookServer(BaseApplication):  # type: ignore[misc]
    """gunicorn, configured in code: no config file, no command-line parsing."""

    def __init__(
        self,
        app: Any,
        options: ServeOptions,
        *,
        post_fork: Callable[[], None] | None = None,
    ) -> None:
        self.application = app
        self.options = options
        self.contexts = ReloadingContext(options.cert, options.key)
        self.post_fork_hook = post_fork
        super().__init__()

    def load_config(self) -> None:
        o = self.options
        contexts = self.contexts
        hook = self.post_fork_hook

        def ssl_context(_conf: Any, _default_factory: Any) -> Any:
            return contexts.get()

        def post_fork(_server: Any, _worker: Any) -> None:
            if hook is not None:
                hook()

        settings: dict[str, Any] = {
            "bind": [o.bind],
            "workers": o.workers,
            "worker_class": o.worker_class,
            "threads": o.threads,
            "certfile": str(o.cert),
            "keyfile": str(o.key),
            "ssl_context": ssl_context,
            "reuse_port": True,
            "keepalive": o.keepalive,
            "timeout": o.timeout,
            "graceful_timeout": 20,
            "loglevel": o.log_level,
            "errorlog": "-",
            "accesslog": "-" if o.access_log else None,
            "post_fork": post_fork,
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
