"""``gpushare-webhook node``: what runs on a GPU node (shim install, agent loop, metrics).

Each action is one entry of ``ACTIONS``: its name, its help, a function
that adds its flags and one that runs it. ``add_parser`` makes the group
from that table, so a new action is one more entry.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from webhook.cli import node_metrics, node_regions
from webhook.cli.args import EXIT_OK, positive_seconds
from webhook.decision import DEFAULT_POLICY, SHIM_LABEL, Policy
from webhook.errors import InputError
from webhook.node.agent import Target, install_shim, run

SOURCE = "/opt/gpushare/shim/libvgpu.so"  # where the Dockerfile puts the library it builds
HOST_ROOT = "/host"  # where the DaemonSet mounts the node's shim.hostPath, under its own path


class Action(NamedTuple):
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _shim_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        default=SOURCE,
        metavar="FILE",
        help="the library to install (default: %(default)s)",
    )
    parser.add_argument(
        "--host-root",
        default=HOST_ROOT,
        metavar="DIR",
        help="where the node's shim.hostPath is mounted, under its own path: the library goes "
        "to DIR/<shim.hostPath>/<shim.library> (default: %(default)s)",
    )
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="the webhook's policy, for its shim section (default: built-in)",
    )


def _agent_arguments(parser: argparse.ArgumentParser) -> None:
    _shim_arguments(parser)
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how often the library and the label are checked again (default: %(default)g)",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        metavar="NAME",
        help="the Node to label (default: $NODE_NAME, set from spec.nodeName)",
    )
    parser.add_argument(
        "--no-label", dest="label", action="store_false", help=f"do not set {SHIM_LABEL}"
    )
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster)")
    parser.add_argument("--context", help="kubeconfig context")


def _policy(path: str | None) -> Policy:
    if path is None:
        return DEFAULT_POLICY
    from webhook.serving.runtime import read_policy

    return read_policy(Path(path))


def _target(args: argparse.Namespace) -> Target:
    return Target.of(_policy(args.policy), source=Path(args.source), host_root=Path(args.host_root))


def cmd_install_shim(args: argparse.Namespace) -> int:
    done = install_shim(_target(args))
    print(f"{done.path}: {done.outcome} (sha256 {done.sha256})")
    return EXIT_OK


def cmd_agent(args: argparse.Namespace) -> int:
    target = _target(args)
    label = None
    if args.label:
        if not args.node_name:
            raise InputError(
                "no node name: set NODE_NAME from the downward API (fieldRef spec.nodeName) "
                "or give --node-name"
            )
        from webhook.cluster import kube
        from webhook.cluster.nodelabel import NodeLabel

        label = NodeLabel(
            kube.api_client(args.kubeconfig, args.context), args.node_name, SHIM_LABEL
        )
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run(target, label, interval=args.interval, stop=stop)
    return EXIT_OK


ACTIONS = (
    Action(
        "install-shim",
        "install the shim library on this node once, and exit",
        _shim_arguments,
        cmd_install_shim,
    ),
    Action(
        "agent",
        f"keep the shim installed and the Node labelled {SHIM_LABEL} (the DaemonSet's command)",
        _agent_arguments,
        cmd_agent,
    ),
    Action(
        "metrics",
        "serve each GPU container's use of its GPU against its limit, for Prometheus",
        node_metrics.add_arguments,
        node_metrics.cmd_node_metrics,
    ),
    Action(
        "init-regions",
        "write each GPU container's accounting region before the pod starts (its init step)",
        node_regions.add_arguments,
        node_regions.cmd_init_regions,
    ),
)


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    node = commands.add_parser(
        "node", help="run on a GPU node: install the shim, label the node, serve GPU use"
    )
    actions = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    for action in ACTIONS:
        parser = actions.add_parser(action.name, help=action.help)
        action.add_arguments(parser)
        parser.set_defaults(node_run=action.run)
