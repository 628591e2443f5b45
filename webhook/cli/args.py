"""The command line: every sub-command's flags, and the exit codes.

Exit codes: 0 done, 1 a pod was rejected (``mutate``) or the cluster
refused (``certs install``), 2 the input or the flags cannot be used,
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Callable
from typing import NoReturn, TypeAlias

from webhook import __version__

EXIT_OK, EXIT_REJECTED, EXIT_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
AGENT_SELECTOR = "app.kubernetes.io/name=gpushare-webhook-node-agent"  # the DaemonSet's pods

_DURATION = re.compile(r"(\d+)([dhm])")


def duration(text: str) -> dt.timedelta:
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: use a number and d, h or m, such as 30d")
    amount, unit = int(match[1]), match[2]
    return dt.timedelta(**{{"d": "days", "h": "hours", "m": "minutes"}[unit]: amount})


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return value


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 seconds or more")
    return value


_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}"
_VALUE = rf"({_NAME})?"
_REQUIREMENT = re.compile(
    rf"!?{_KEY}"
    rf"|{_KEY}\s*(=|==|!=)\s*{_VALUE}"
    rf"|{_KEY}\s+(in|notin)\s*\(\s*{_VALUE}(\s*,\s*{_VALUE})*\s*\)"
)


def label_selector(text: str) -> str:
    """A label selector as kubectl takes it (``gpushare=true``, ``pool in (a,b)``, ``!spot``).

    Empty selects every node.
    """
    if not text.strip():
        return ""
    requirements = re.split(r",(?![^(]*\))", text)
    for requirement in requirements:
        if not _REQUIREMENT.fullmatch(requirement.strip()):
            raise argparse.ArgumentTypeError(
                f"{requirement.strip()!r} is not a label selector requirement; write such as "
                "gpushare=true, 'pool in (a,b)' or '!spot', joined by commas"
            )
    return text


# Serve's defaults live in webhook.serving (ServeOptions); they are written
# here too so --help needs no gunicorn import, and a test holds the two equal.
SERVE_DEFAULTS = {
    "workers": 2,
    "threads": 4,
    "read_timeout": 10.0,
    "idle_timeout": 120,
    "drain": 5.0,
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage mistake said in one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


# What add_subparsers returns: each sub-command is added to it.
Commands: TypeAlias = "argparse._SubParsersAction[OneLineParser]"


def build_parser(
    prog: str, *, top: Callable[[OneLineParser], None], node: Callable[[Commands], None]
) -> argparse.ArgumentParser:
    """Every command's flags; ``top`` and ``node`` are added by their own modules' functions."""
    parser = OneLineParser(
        prog=prog,
        description="Kubernetes admission webhook that makes GPU sharing safe.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _serve_command,
        _mutate_command,
        _report_command,
        lambda sub: top(
            sub.add_parser("top", help="GPU memory per node, GPU and pod: reserved, limit, used")
        ),
        _certs_command,
        _policy_command,
    ):
        add(sub)
    node(sub)
    return parser


def _serve_command(sub: Commands) -> None:
    """``serve`` and its flags, in the order --help lists them."""
    serve = sub.add_parser("serve", help="run the webhook over HTTPS under gunicorn")
    for add in (
        _serve_policy_args,
        _serve_tls_args,
        _serve_gunicorn_args,
        _serve_node_watch_args,
        _serve_observability_args,
    ):
        add(serve)


def _serve_policy_args(serve: argparse.ArgumentParser) -> None:
    """``serve``'s policy file."""
    serve.add_argument("--policy", metavar="FILE", help="policy YAML (default: built-in defaults)")


def _serve_tls_args(serve: argparse.ArgumentParser) -> None:
    """``serve``'s certificate and key, or where a development pair is made."""
    serve.add_argument("--cert", metavar="FILE", help="serving certificate (PEM)")
    serve.add_argument("--key", metavar="FILE", help="private key of --cert (PEM)")
    serve.add_argument(
        "--certs-dir",
        metavar="DIR",
        default="certs",
        help="where a development CA and certificate are made when --cert is not given "
        "(default: %(default)s)",
    )


def _serve_gunicorn_args(serve: argparse.ArgumentParser) -> None:
    """``serve``'s address, gunicorn workers and threads, and request timeout."""
    serve.add_argument(
        "--bind", default="0.0.0.0:8443", metavar="HOST:PORT", help="default: %(default)s"
    )
    serve.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help=f"gunicorn worker processes (default: {SERVE_DEFAULTS['workers']})",
    )
    serve.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help=f"threads per worker (default: {SERVE_DEFAULTS['threads']})",
    )
    serve.add_argument(
        "--read-timeout",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="time a client has from connecting (or from a request's first byte on an idle "
        f"connection) to send a whole request (default: {SERVE_DEFAULTS['read_timeout']:g})",
    )
    serve.add_argument(
        "--idle-timeout",
        type=positive_int,
        default=None,
        metavar="SECONDS",
        help="time a kept-alive connection may sit idle; keep it above the API server's 90 "
        f"(default: {SERVE_DEFAULTS['idle_timeout']})",
    )
    serve.add_argument(
        "--drain",
        type=non_negative_seconds,
        default=None,
        metavar="SECONDS",
        help="after SIGTERM, time readiness fails while calls are still answered, before the "
        f"server stops; 0 stops at once (default: {SERVE_DEFAULTS['drain']:g})",
    )
    serve.add_argument(
        "--worker-class",
        default=None,
        choices=("buffering", "gthread", "sync", "gevent"),
        help=argparse.SUPPRESS,  # for comparing worker models in bench/ (gevent: if installed)
    )


def _serve_node_watch_args(serve: argparse.ArgumentParser) -> None:
    """``serve``'s watch of the cluster's Nodes for GPU sizes."""
    serve.add_argument(
        "--watch-nodes",
        action="store_true",
        help="read GPU sizes from the cluster's Nodes (list and watch; needs RBAC on nodes)",
    )
    serve.add_argument(
        "--node-selector",
        type=label_selector,
        default="",
        metavar="LABELS",
        help="watch only the nodes with these labels, such as gpushare=true, the label the "
        "GPU-share device plugin runs on (default: every node)",
    )
    serve.add_argument("--kubeconfig", help="kubeconfig for --watch-nodes (default: in-cluster)")
    serve.add_argument("--context", help="kubeconfig context for --watch-nodes")


def _serve_observability_args(serve: argparse.ArgumentParser) -> None:
    """``serve``'s metrics and logging."""
    serve.add_argument(
        "--no-metrics", dest="metrics", action="store_false", help="do not serve /metrics"
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="default: %(default)s",
    )
    serve.add_argument(
        "--log-format",
        default="auto",
        choices=("auto", "json", "text"),
        help="one JSON object per line, for a log collector, or text for a person; auto is "
        "text when stderr is a terminal, else JSON (default: %(default)s)",
    )
    serve.add_argument("--access-log", action="store_true", help="log every HTTP request")


def _mutate_command(sub: Commands) -> None:
    """``mutate`` and its flags."""
    mutate = sub.add_parser("mutate", help="preview what admission does to pods or workloads")
    mutate.add_argument("file", nargs="?", default="-", help="YAML or JSON file, or - for stdin")
    mutate.add_argument("--policy", metavar="FILE")
    mutate.add_argument(
        "--output",
        "-o",
        choices=("yaml", "json", "patch", "templates"),
        default="yaml",
        help="patch: each document's JSON Patch, [] when unchanged, null when refused; "
        "templates: the ResourceClaimTemplates its pods' claims are made from (scheduler: dra)",
    )
    mutate.add_argument(
        "--namespace",
        "-n",
        default="",
        metavar="NS",
        help="where documents that name no namespace will be created (as kubectl apply -n)",
    )


def _report_command(sub: Commands) -> None:
    """``report`` and its flags."""
    report = sub.add_parser(
        "report",
        help="find the GPU pods and workloads that are not confined, or would be refused",
    )
    report.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="read a file saved with kubectl get pods,deployments,statefulsets,daemonsets,"
        "jobs,cronjobs,replicasets[,nodes] -A -o json (- for standard input), not the cluster",
    )
    report.add_argument(
        "--policy",
        metavar="FILE",
        help="judge by this policy (default: the cluster's, from --policy-configmap; with "
        "--from, the built-in defaults)",
    )
    report.add_argument(
        "--policy-configmap",
        default="gpushare-system/gpushare-webhook-policy",
        metavar="NS/NAME",
        help="where the cluster's policy is (default: %(default)s)",
    )
    report.add_argument(
        "--output", "-o", choices=("table", "json"), default="table", help="default: %(default)s"
    )
    report.add_argument(
        "--namespace",
        "-n",
        default="",
        metavar="NS",
        help="only the pods and workloads of this namespace (default: all)",
    )
    report.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube)")
    report.add_argument("--context", help="kubeconfig context")
    add_agent_arguments(report)  # what each pod uses, from the node agents


def _certs_command(sub: Commands) -> None:
    """``certs create`` and ``certs install``, and their flags."""
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


def _policy_command(sub: Commands) -> None:
    """``policy check``, ``policy show`` and ``policy guard``."""
    policy = sub.add_parser("policy", help="check or show a policy")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = policy_sub.add_parser("check", help="validate a policy file offline")
    check.add_argument("file")
    show = policy_sub.add_parser("show", help="print the effective policy, defaults filled in")
    show.add_argument("file", nargs="?", help="policy file (default: built-in defaults)")
    guard = policy_sub.add_parser(
        "guard",
        help="print the ValidatingAdmissionPolicy that refuses GPU pods the webhook did not set up",
    )
    guard.add_argument("file", nargs="?", help="policy file (default: built-in defaults)")
    guard.add_argument(
        "--namespace",
        default="gpushare-system",
        metavar="NS",
        help="the webhook's namespace, never guarded (default: %(default)s)",
    )


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


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the node agents are, for ``top`` and ``report``."""
    parser.add_argument(
        "--agent-namespace",
        default="gpushare-system",
        metavar="NS",
        help="the node agents' namespace (default: %(default)s)",
    )
    parser.add_argument(
        "--agent-selector",
        default=AGENT_SELECTOR,
        metavar="LABELS",
        help="the node agents' pods (default: %(default)s)",
    )
    parser.add_argument(
        "--agent-port",
        type=int,
        default=9394,
        metavar="PORT",
        help="their metrics port (default: %(default)s)",
    )
