"""``gpushare-webhook serve``: the webhook under gunicorn with TLS.

Checks what can be checked before gunicorn starts (flags, the policy, the
certificate pair, credentials for ``--watch-nodes``), so a bad start-up is
one line and exit 2, not a worker restart loop.
"""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import logging.config
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from webhook.cli.args import EXIT_OK
from webhook.decision import NodeSource

if TYPE_CHECKING:
    from webhook.cluster.watchprocess import NodeWatch
    from webhook.serving.app import State
    from webhook.serving.drain import DrainFlag
    from webhook.serving.server import ServeOptions
from webhook.errors import CertificateError, InputError


def cmd_serve(args: argparse.Namespace) -> int:
    from webhook import tls
    from webhook.serving import logs
    from webhook.serving.app import State, create_app
    from webhook.serving.runtime import PolicySource
    from webhook.serving.server import WebhookServer

    log_config = logs.config(args.log_level, logs.chosen_format(args.log_format, sys.stderr))
    logs.skip_unused_record_fields()
    logging.config.dictConfig(log_config)
    source = PolicySource(Path(args.policy) if args.policy else None)
    if bool(args.cert) != bool(args.key):
        raise CertificateError("give --cert and --key together, or neither for a development pair")
    host, port = _bind(args.bind)
    _check_port_free(host, int(port), args.bind)
    cert, key = _certificate_pair(args, host, port)
    tls.check_pair(cert, key)
    owned: list[Path] = []  # directories this process made, removed at its exit
    nodes, watch, liveness = _node_source(args, owned)
    drain_flag = _drain_flag(owned)
    state = State(policy=source, nodes=nodes, ready=_readiness(host, int(port), nodes, drain_flag))
    if liveness is not None:
        state.alive = liveness
    if args.metrics:
        from webhook.serving.runtime import prepare_metrics_directory

        metrics_dir = prepare_metrics_directory()  # before prometheus_client is imported
        if metrics_dir is not None:
            owned.append(metrics_dir)
        from webhook.serving import metrics

        state.metrics = metrics.Metrics(source, nodes, cert)
    options = _serve_options(args, cert, key, log_config, state, drain_flag=drain_flag.path)
    master = os.getpid()
    app = create_app(state)
    # A forked process shares this one's memory until it writes to it,
    # and a garbage collection there writes to every object it scans. Frozen
    # objects are never scanned, so the node watch and the workers keep them
    # shared (measured: bench/run.py --memory).
    gc.freeze()
    try:
        if watch is not None:
            # One watch for the server, forked now, while this process has one
            # thread; it alone imports the kubernetes client and checks the
            # credentials (a failure stops the start here, in one line).
            watch.start(log_config)
            watch.wait_first(timeout=5.0)
        _log_serving(args, options)
        WebhookServer(app, options).run()
    finally:
        # Workers unwind through here too when they exit; only the master cleans up.
        if os.getpid() == master:
            if watch is not None:
                watch.stop()
            for directory in owned:
                shutil.rmtree(directory, ignore_errors=True)
    return EXIT_OK


def _certificate_pair(args: argparse.Namespace, host: str, port: str) -> tuple[Path, Path]:
    """``--cert`` and ``--key``, or a development pair made (or reused) in ``--certs-dir``."""
    from webhook import tls

    if args.cert:
        return Path(args.cert), Path(args.key)
    issued = tls.ensure_certificates(_dev_dir(Path(args.certs_dir)), **_DEV_NAMES)
    local = "localhost" if host in ("0.0.0.0", "127.0.0.1", "::", "localhost") else host
    print(
        f"gpushare-webhook: development certificate in {issued.directory}/ "
        f"({'new' if issued.serving_created else 'reused'}); CA: {issued.ca}\n"
        f"  try: curl --cacert {issued.ca} https://{local}:{port}/healthz",
        file=sys.stderr,
        flush=True,
    )
    return issued.cert, issued.key


def _node_source(
    args: argparse.Namespace, owned: list[Path]
) -> tuple[NodeSource, NodeWatch | None, Callable[[], tuple[bool, str]] | None]:
    """Where workers learn the GPU nodes: the one node watch process of the server (made,
    not started: its directory added to ``owned``) and its liveness, or none with no watch."""
    from webhook.decision import NoNodes

    if not args.watch_nodes:
        return NoNodes(), None, None
    from webhook.cluster import watchprocess
    from webhook.serving.nodefile import SharedNodes
    from webhook.serving.runtime import runtime_dir

    shared = runtime_dir("gpushare-nodes-")
    owned.append(shared)
    watch = watchprocess.NodeWatch(
        shared / "nodes.json",
        watchprocess.WatchOptions(
            kubeconfig=args.kubeconfig,
            context=args.context,
            label_selector=args.node_selector,
            policy=str(Path(args.policy).absolute()) if args.policy else None,
        ),
    )
    shared_nodes = SharedNodes(watch.snapshot, alive=watch.alive, templates=watch.counts)
    return shared_nodes, watch, shared_nodes.liveness


def _drain_flag(owned: list[Path]) -> DrainFlag:
    """The flag the arbiter raises on SIGTERM and the workers read (webhook.serving.drain)."""
    from webhook.serving.drain import DrainFlag
    from webhook.serving.runtime import runtime_dir

    directory = runtime_dir("gpushare-drain-")
    owned.append(directory)
    return DrainFlag(directory / "draining")


def _serve_options(
    args: argparse.Namespace,
    cert: Path,
    key: Path,
    log_config: dict[str, Any],
    state: State,
    *,
    drain_flag: Path,
) -> ServeOptions:
    """gunicorn's settings: the flags given, the rest left to ServeOptions' defaults."""
    from webhook.serving.server import ServeOptions

    return ServeOptions(
        bind=args.bind,
        cert=cert,
        key=key,
        log_level=args.log_level,
        access_log=args.access_log,
        log_config=log_config,
        on_connection_cut=state.metrics.connection_cut if state.metrics else None,
        drain_flag=drain_flag,
        **{
            name: value
            for name, value in (
                ("workers", args.workers),
                ("threads", args.threads),
                ("worker_class", args.worker_class),
                ("read_timeout", args.read_timeout),
                ("keepalive", args.idle_timeout),
                ("drain", args.drain),
            )
            if value is not None
        },
    )


def _log_serving(args: argparse.Namespace, options: ServeOptions) -> None:
    # gunicorn's own "Listening at" line is empty with reuse_port (each worker binds).
    logging.getLogger("gpushare_webhook.serve").info(
        "serving",
        extra={
            "fields": {
                "url": f"https://{args.bind}/mutate",
                "workers": options.workers,
                "threads": options.threads,
                "worker_class": options.worker_class,
                "read_timeout": options.read_timeout,
                "idle_timeout": options.keepalive,
                "drain": options.drain,
                "policy": args.policy or "built-in defaults",
                "watch_nodes": bool(args.watch_nodes),
                **({"node_selector": args.node_selector} if args.node_selector else {}),
                "metrics": bool(args.metrics),
            }
        },
    )


_DEV_NAMES: dict[str, Any] = {"dns_names": ["localhost"], "ips": ["127.0.0.1", "::1"]}


def _bind(bind: str) -> tuple[str, str]:
    """(host, port) of ``--bind``, refused in one line when it cannot be listened on."""
    host, _, port = bind.rpartition(":")
    if not port.isdigit() or not host:
        raise InputError(f"--bind {bind!r}: expected HOST:PORT, such as 0.0.0.0:8443")
    if int(port) == 0:
        raise InputError(
            f"--bind {bind!r}: choose a port; with 0, each worker would listen on one of its own"
        )
    if int(port) > 65535:
        raise InputError(f"--bind {bind!r}: the port must be 1 to 65535")
    return host, port


def _check_port_free(host: str, port: int, bind: str) -> None:
    """Refuse a port another program, or another ``serve``, already listens on.

    The workers share the port with SO_REUSEPORT, so a second server
    started on a busy port would be let in by the kernel and handed half of
    the connections. A probe bound without SO_REUSEPORT fails against any
    listener, ours included (SO_REUSEADDR only passes connections that are
    closing).
    """
    try:
        infos = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as error:
        raise InputError(f"--bind {bind!r}: cannot resolve {host!r} ({error})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise InputError(
                    f"--bind {bind}: port {port} is already in use (by another program, or "
                    "another gpushare-webhook serve); stop it or choose another port"
                ) from None
            raise InputError(f"--bind {bind}: cannot listen there ({error.strerror})") from None


def _dev_dir(directory: Path) -> Path:
    """The development pair's directory, if serve may make or renew a pair in it.

    A pair someone made for another server (``certs create`` for the
    Service, say) is never replaced: serve refuses it and says how to use it.
    """
    from webhook import tls

    if directory.exists() and not directory.is_dir():
        raise InputError(f"--certs-dir {directory}: is a file, not a directory")
    cert = directory / tls.CERT_FILE
    if cert.is_file():
        try:
            names = tls.subject_names(tls.load_certs(cert)[0])
        except CertificateError:
            names = []  # unreadable: made again, as before
        else:
            wanted = [*_DEV_NAMES["dns_names"], *_DEV_NAMES["ips"]]
            if not set(wanted) <= set(names):
                named = ", ".join(names) or "no host"
                raise CertificateError(
                    f"{cert} is not a development certificate (it names {named}, "
                    f"not {', '.join(wanted)}), and serve does not replace it: serve it with "
                    f"--cert {cert} --key {directory / tls.KEY_FILE}, or give --certs-dir a "
                    "directory of its own"
                )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"--certs-dir {directory}: cannot be made ({error.strerror})") from None
    return directory


def _readiness(
    host: str, port: int, nodes: NodeSource, draining: Callable[[], bool], *, ttl: float = 5.0
) -> Callable[[], tuple[bool, str]]:
    """Ready once the policy and certificate are loaded and our own port answers TLS.

    The policy and pair are loaded before gunicorn starts (or it never
    starts), so what is left to prove is the listener itself (and that the
    server is not draining: see webhook.serving.drain); and, with
    --watch-nodes, that the first node list has been answered: a replica
    that took traffic before would judge pods by the policy's guess. A
    failed list does not hold readiness back (the policy then bounds, and
    says so). The handshake is cached for ``ttl`` seconds: probes should
    not cost a handshake each.
    """
    import time

    from webhook.serving.context import handshake

    target = (
        "127.0.0.1" if host in ("0.0.0.0", "", "*") else "::1" if host in ("::", "[::]") else host
    )
    target = target.strip("[]")
    cache: dict[str, Any] = {"at": -ttl, "result": (False, "not checked yet")}

    def ready() -> tuple[bool, str]:
        if draining():
            return False, "draining: the server is stopping"
        status = nodes.status()
        if status.watching and not status.tried:
            return False, "waiting for the first node list"
        now = time.monotonic()
        if now - cache["at"] >= ttl:
            problem = handshake(target, port)
            cache["at"], cache["result"] = now, (not problem, problem or "ok")
        result: tuple[bool, str] = cache["result"]
        return result

    return ready
