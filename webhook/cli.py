"""The ``gpushare-webhook`` command: serve, mutate, certs, policy.

Owns argument parsing, reading files and standard input, exit codes and
what is printed. Each sub-command is a thin shell over the pure modules.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import logging.config
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from webhook import __version__
from webhook.decision.capacity import NodeSource
from webhook.decision.policy import DEFAULT_POLICY, Policy, dump_policy
from webhook.errors import CertificateError, InputError, PolicyError, WebhookError
from webhook.serving.runtime import read_policy

EXIT_OK, EXIT_REJECTED, EXIT_INPUT = 0, 1, 2
_DURATION = re.compile(r"(\d+)([dhm])")


def duration(text: str) -> dt.timedelta:
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: use a number and d, h or m, such as 30d")
    amount, unit = int(match[1]), match[2]
    return dt.timedelta(**{{"d": "days", "h": "hours", "m": "minutes"}[unit]: amount})


def _policy(path: str | None) -> Policy:
    return DEFAULT_POLICY if path is None else read_policy(Path(path))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare-webhook",
        description="Kubernetes admission webhook that makes GPU sharing safe.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the webhook over HTTPS under gunicorn")
    serve.add_argument("--policy", metavar="FILE", help="policy YAML (default: built-in defaults)")
    serve.add_argument("--cert", metavar="FILE", help="serving certificate (PEM)")
    serve.add_argument("--key", metavar="FILE", help="private key of --cert (PEM)")
    serve.add_argument(
        "--certs-dir",
        metavar="DIR",
        default="certs",
        help="where a development CA and certificate are made when --cert is not given "
        "(default: %(default)s)",
    )
    serve.add_argument("--bind", default="0.0.0.0:8443", metavar="HOST:PORT")
    serve.add_argument("--workers", type=int, default=None, help="gunicorn worker processes")
    serve.add_argument("--threads", type=int, default=None, help="threads per worker")
    serve.add_argument(
        "--read-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time a client has from connecting (or its first byte on a kept-alive "
        "connection) to send a whole request (default: 10)",
    )
    serve.add_argument(
        "--worker-class",
        default=None,
        choices=("buffering", "gthread", "sync", "gevent"),
        help=argparse.SUPPRESS,  # for comparing worker models in bench/ (gevent: if installed)
    )
    serve.add_argument(
        "--watch-nodes",
        action="store_true",
        help="read GPU sizes from the cluster's Nodes (list and watch; needs RBAC on nodes)",
    )
    serve.add_argument("--kubeconfig", help="kubeconfig for --watch-nodes (default: in-cluster)")
    serve.add_argument("--context", help="kubeconfig context for --watch-nodes")
    serve.add_argument(
        "--no-metrics", dest="metrics", action="store_false", help="do not serve /metrics"
    )
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.add_argument(
        "--log-format", default="json", choices=("json", "text"), help="default: %(default)s"
    )
    serve.add_argument("--access-log", action="store_true", help="log every HTTP request")

    mutate = sub.add_parser("mutate", help="preview what admission does to pods or workloads")
    mutate.add_argument("file", nargs="?", default="-", help="YAML or JSON file, or - for stdin")
    mutate.add_argument("--policy", metavar="FILE")
    mutate.add_argument("--output", "-o", choices=("yaml", "json", "patch"), default="yaml")

    certs = sub.add_parser("certs", help="make and install certificates")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    create = certs_sub.add_parser("create", help="make a CA and a serving certificate")
    _cert_args(create)
    create.add_argument("--out", default="certs", metavar="DIR")
    install = certs_sub.add_parser(
        "install",
        help="make or renew certificates and publish them to the cluster (Secret + caBundle)",
    )
    _cert_args(install)
    install.add_argument("--secret", default="gpushare-webhook-tls", help="serving Secret")
    install.add_argument("--ca-secret", default="gpushare-webhook-ca", help="Secret holding the CA")
    install.add_argument(
        "--webhook-config", default="gpushare-webhook", help="MutatingWebhookConfiguration name"
    )
    install.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube)")
    install.add_argument("--context", help="kubeconfig context")

    policy = sub.add_parser("policy", help="check or show a policy")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = policy_sub.add_parser("check", help="validate a policy file offline")
    check.add_argument("file")
    show = policy_sub.add_parser("show", help="print the effective policy, defaults filled in")
    show.add_argument("file", nargs="?", help="policy file (default: built-in defaults)")
    return parser


def _cert_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", default="gpushare-webhook", help="Service name")
    parser.add_argument("--namespace", default="gpushare-system", help="Service namespace")
    parser.add_argument("--dns", action="append", default=[], help="extra DNS name (repeatable)")
    parser.add_argument("--ip", action="append", default=[], help="extra IP address (repeatable)")
    parser.add_argument("--days", type=int, default=365, help="serving certificate lifetime")
    parser.add_argument("--key-type", choices=("ecdsa", "rsa"), default="ecdsa")
    parser.add_argument(
        "--renew-before",
        type=duration,
        default=dt.timedelta(days=30),
        metavar="DURATION",
        help="renew what expires within this (default: 30d)",
    )


def service_names(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "mutate":
            return cmd_mutate(args, sys.stdin, sys.stdout, sys.stderr)
        if args.command == "certs":
            return cmd_certs(args)
        if args.command == "policy":
            return cmd_policy(args)
    except (PolicyError, CertificateError, InputError) as error:
        print(f"gpushare-webhook: {error}", file=sys.stderr)
        return EXIT_INPUT
    except WebhookError as error:  # pragma: no cover - every subclass is handled above
        print(f"gpushare-webhook: {error}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:  # the reader (head, less) went away: not an error of ours
        sys.stderr.close()
        return EXIT_OK
    return EXIT_INPUT  # pragma: no cover - argparse requires a command


# --- serve -----------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from webhook import tls
    from webhook.decision.capacity import NoNodes
    from webhook.serving import logs
    from webhook.serving.app import State, create_app
    from webhook.serving.runtime import PolicySource
    from webhook.serving.server import ServeOptions, WebhookServer

    log_config = logs.config(args.log_level, args.log_format)
    logs.skip_unused_record_fields()
    logging.config.dictConfig(log_config)
    source = PolicySource(Path(args.policy) if args.policy else None)
    if bool(args.cert) != bool(args.key):
        raise CertificateError("give --cert and --key together, or neither for a development pair")
    host, _, port = args.bind.rpartition(":")
    if not port.isdigit() or not host:
        raise InputError(f"--bind {args.bind!r}: expected HOST:PORT, such as 0.0.0.0:8443")
    if args.cert:
        cert, key = Path(args.cert), Path(args.key)
    else:
        issued = tls.ensure_certificates(
            Path(args.certs_dir), dns_names=["localhost"], ips=["127.0.0.1", "::1"]
        )
        cert, key = issued.cert, issued.key
        local = "localhost" if host in ("0.0.0.0", "127.0.0.1", "::", "localhost") else host
        print(
            f"gpushare-webhook: development certificate in {issued.directory}/ "
            f"({'new' if issued.serving_created else 'reused'}); CA: {issued.ca}\n"
            f"  try: curl --cacert {issued.ca} https://{local}:{port}/healthz",
            file=sys.stderr,
            flush=True,
        )
    tls.check_pair(cert, key)
    nodes: NodeSource = NoNodes()
    start_in_worker: Callable[[], None] | None = None
    if args.watch_nodes:
        from webhook.cluster import kube
        from webhook.cluster import nodes as node_watch

        # Credentials are checked here, so a missing token stops start-up with
        # a clear error; each worker makes its own client and watch after fork.
        kube.api_client(args.kubeconfig, args.context)
        watcher = node_watch.NodeWatcher(lambda: kube.api_client(args.kubeconfig, args.context))
        nodes, start_in_worker = watcher, watcher.start_and_wait
    owned_dir: Path | None = None
    state = State(policy=source, nodes=nodes, ready=_readiness(host, int(port), nodes))
    if args.metrics:
        from webhook.serving.runtime import prepare_metrics_directory

        owned_dir = prepare_metrics_directory()  # before prometheus_client is imported
        from webhook.serving import metrics

        state.metrics = metrics.Metrics(source, nodes, cert)
    options = ServeOptions(
        bind=args.bind,
        cert=cert,
        key=key,
        log_level=args.log_level,
        access_log=args.access_log,
        log_config=log_config,
        on_connection_cut=state.metrics.connection_cut if state.metrics else None,
        **{
            name: value
            for name, value in (
                ("workers", args.workers),
                ("threads", args.threads),
                ("worker_class", args.worker_class),
                ("read_timeout", args.read_timeout),
            )
            if value is not None
        },
    )
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
                "policy": args.policy or "built-in defaults",
                "watch_nodes": bool(args.watch_nodes),
                "metrics": bool(args.metrics),
            }
        },
    )
    master = os.getpid()
    try:
        WebhookServer(create_app(state), options, post_fork=start_in_worker).run()
    finally:
        # Workers unwind through here too when they exit; only the master cleans up.
        if owned_dir is not None and os.getpid() == master:
            shutil.rmtree(owned_dir, ignore_errors=True)
    return EXIT_OK


def _readiness(
    host: str, port: int, nodes: NodeSource, *, ttl: float = 5.0
) -> Callable[[], tuple[bool, str]]:
    """Ready once the policy and certificate are loaded and our own port answers TLS.

    The policy and pair are loaded before gunicorn starts (or it never
    starts), so what is left to prove is the listener itself; and, with
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


# --- mutate ----------------------------------------------------------------


def _read_documents(path: str, stdin: TextIO) -> list[Any]:
    try:
        text = stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {path}: {error}") from None
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise InputError(f"{path} is not valid YAML or JSON: {error}") from None
    if not documents:
        raise InputError(f"{path} holds no documents")
    expanded: list[Any] = []
    for doc in documents:
        # A v1 List (what kubectl get -o yaml prints) is its items.
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            expanded.extend(doc["items"])
        else:
            expanded.append(doc)
    return expanded


def cmd_mutate(args: argparse.Namespace, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    from webhook.preview import preview

    policy = _policy(args.policy)
    documents = _read_documents(args.file, stdin)
    results = [preview(doc, policy, index=i) for i, doc in enumerate(documents, start=1)]
    kept = []
    for result in results:
        for note in result.notes:
            print(f"warning: {note}", file=stderr)
        if result.decision is not None:
            for warning in result.decision.warnings:
                print(f"warning: {result.label}: {warning}", file=stderr)
        if result.rejected:
            assert result.decision is not None
            print(f"rejected: {result.label}: {result.decision.message}", file=stderr)
        else:
            kept.append(result)
    if args.output == "patch":
        patches = [r.patch for r in kept]
        json.dump(patches[0] if len(patches) == 1 else patches, stdout, indent=2)
        stdout.write("\n")
    elif args.output == "json":
        objects = [r.document for r in kept]
        out: Any = (
            objects[0]
            if len(objects) == 1
            else {"apiVersion": "v1", "kind": "List", "items": objects}
        )
        json.dump(out, stdout, indent=2)
        stdout.write("\n")
    else:
        yaml.safe_dump_all([r.document for r in kept], stdout, sort_keys=False)
    return EXIT_REJECTED if any(r.rejected for r in results) else EXIT_OK


# --- certs -----------------------------------------------------------------


def cmd_certs(args: argparse.Namespace) -> int:
    from webhook import tls

    if args.certs_command == "install":
        return cmd_certs_install(args)
    names = service_names(args.service, args.namespace) + list(args.dns)
    issued = tls.ensure_certificates(
        Path(args.out),
        dns_names=names,
        ips=args.ip,
        days=args.days,
        key_type=args.key_type,
        renew_before=args.renew_before,
    )
    what = []
    what.append("new CA" if issued.ca_created else "kept CA")
    what.append("new serving certificate" if issued.serving_created else "kept serving certificate")
    print(
        f"{issued.directory}: {', '.join(what)}; serving certificate valid until "
        f"{issued.not_after:%Y-%m-%d %H:%M} UTC"
    )
    return EXIT_OK


def cmd_certs_install(args: argparse.Namespace) -> int:
    from webhook.cluster import certs, kube
    from webhook.errors import KubeError

    try:
        api = kube.api_client(args.kubeconfig, args.context)
        report = certs.install_certificates(
            api,
            namespace=args.namespace,
            secret=args.secret,
            ca_secret=args.ca_secret,
            webhook_config=args.webhook_config,
            dns_names=service_names(args.service, args.namespace) + list(args.dns),
            ips=list(args.ip),
            days=args.days,
            renew_before=args.renew_before,
            key_type=args.key_type,
        )
    except KubeError as error:
        print(f"gpushare-webhook: {error}", file=sys.stderr)
        return EXIT_REJECTED
    print(
        f"{args.namespace}/{args.secret}: "
        f"{'renewed' if report.serving_renewed else 'kept'} serving certificate (valid until "
        f"{report.not_after:%Y-%m-%d} UTC); {'new' if report.ca_rotated else 'kept'} CA (valid "
        f"until {report.ca_not_after:%Y-%m-%d} UTC); caBundle updated in "
        f"{report.webhooks_patched} webhook(s) of {args.webhook_config}"
    )
    return EXIT_OK


# --- policy ----------------------------------------------------------------


def cmd_policy(args: argparse.Namespace) -> int:
    if args.policy_command == "check":
        read_policy(Path(args.file))
        print(f"{args.file}: policy is valid")
        return EXIT_OK
    sys.stdout.write(dump_policy(_policy(args.file)))
    return EXIT_OK
