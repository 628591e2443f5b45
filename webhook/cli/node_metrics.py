"""``gpushare-webhook node metrics``: serve each GPU container's use of its GPU, for Prometheus.

The node agent's command: reads HAMi-core's regions under the kubelet's
pods directory (``webhook.node``), names them through this node's pods
(the API, or a saved ``kubectl get pods -o json`` with ``--pods-from``),
and serves them on ``--listen``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from webhook.cluster.incluster import SERVICE_ACCOUNT  # the standard library only
from webhook.errors import InputError

if TYPE_CHECKING:
    from webhook.node.exporter import PodLister

NAMES = ("gpushare", "hami")  # webhook.node.exporter.Names, imported only when serving

NODE_ENV = "NODE_NAME"  # the downward API's spec.nodeName, as the DaemonSet sets it
DEFAULT_PODS_DIR = "/var/lib/kubelet/pods"
DEFAULT_LISTEN = "0.0.0.0:9394"  # HAMi's vGPU monitor's port, so its scrape configs carry over


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pods-dir",
        default=DEFAULT_PODS_DIR,
        metavar="DIR",
        help="the kubelet's pods directory, as mounted in the agent (default: %(default)s)",
    )
    parser.add_argument(
        "--node",
        default=os.environ.get(NODE_ENV, ""),
        help=f"this node's name (default: ${NODE_ENV})",
    )
    parser.add_argument(
        "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help="default: %(default)s"
    )
    parser.add_argument(
        "--metric-names",
        choices=NAMES,
        default=NAMES[0],
        help="name the per-container figures as gpushare does or as HAMi's vGPU monitor does, "
        "so its dashboards work unchanged (default: %(default)s)",
    )
    parser.add_argument(
        "--pods-from",
        metavar="FILE",
        help="name pods from a saved kubectl get pods -o json, read on each refresh, not the API",
    )
    parser.add_argument(
        "--refresh",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="list this node's pods again after this long (default: %(default)s)",
    )
    parser.add_argument(
        "--service-account",
        default=SERVICE_ACCOUNT,
        metavar="DIR",
        help="in a pod, its service account's token and ca.crt (default: %(default)s)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube)")
    parser.add_argument("--context", help="kubeconfig context")


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--listen {text!r}: write HOST:PORT, such as {DEFAULT_LISTEN}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _from_file(path: str) -> PodLister:
    def read() -> Iterable[Mapping[str, Any]]:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise InputError(f"--pods-from {path}: {error}") from None
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise InputError(f"--pods-from {path}: not a list of pods (kubectl get pods -o json)")
        return [item for item in items if isinstance(item, dict)]

    read()  # a file that cannot be used is an answer now, not a warning per scrape
    return read


def _from_api(args: argparse.Namespace) -> PodLister:
    if not args.node:
        raise InputError(f"no node name: pass --node or set {NODE_ENV} (the downward API)")
    if args.kubeconfig is None and args.context is None:
        from webhook.cluster import incluster  # the standard library only: no kubernetes client

        source = incluster.in_cluster(args.service_account)
        if source is not None:
            return lambda: incluster.list_node_pods(source, args.node)
    from webhook.cluster import kube  # the kubernetes client, outside a pod
    from webhook.cluster.nodepods import list_node_pods

    api = kube.api_client(args.kubeconfig, args.context, retries=0)
    return lambda: list_node_pods(api, args.node)


def cmd_node_metrics(args: argparse.Namespace) -> int:
    host, port = _listen(args.listen)
    pods_dir = Path(args.pods_dir)
    if not pods_dir.is_dir():
        raise InputError(f"--pods-dir {pods_dir}: no such directory (mount the kubelet's pods)")
    if args.refresh <= 0:
        raise InputError(f"--refresh {args.refresh}: write a number of seconds above 0")
    from webhook.node.exporter import Names, RegionCollector, serve  # prometheus_client, here only

    lister = _from_file(args.pods_from) if args.pods_from else _from_api(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    collector = RegionCollector(
        pods_dir, lister, names=Names(args.metric_names), refresh=args.refresh
    )
    serve(collector, host, port)
    return 0
