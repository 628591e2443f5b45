"""``gpushare-webhook report``: which GPU pods and workloads are confined, and which slipped past.

Reads the cluster (in-cluster credentials, else the kubeconfig), or a file
saved with ``kubectl get pods,deployments,... -A -o json``; judges it by
the policy in force (the webhook's ConfigMap, unless ``--policy`` names a
file) with ``webhook.report``, what each pod uses from the node agents
(reading the cluster only), at the time the clock reads now; prints a
table or JSON. Exit 0 when all is confined, 1 when something drifted or
would be refused, a bound GPU pod holds memory the scheduler extender did
not reserve, GPU pods wait for a scheduler nobody answers, or the report
has a finding of its own (DRA: a mapping DeviceClass, pods left to move);
2 on an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from webhook.cli.args import EXIT_OK, EXIT_REJECTED
from webhook.cli.offline import read_documents
from webhook.decision import DEFAULT_POLICY, Policy, parse_policy_text
from webhook.errors import InputError, KubeError
from webhook.report.findings import build_report
from webhook.report.objects import sort_objects
from webhook.report.render import as_json, as_table
from webhook.serving.runtime import read_policy

if TYPE_CHECKING:
    from webhook.node.scraped import Used


def _now() -> datetime:
    return datetime.now(UTC)


def cmd_report(
    args: argparse.Namespace,
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
    *,
    clock: Callable[[], datetime] = _now,
) -> int:
    notes: list[str] = []
    usage: dict[tuple[str, str], int] | None = None  # measured by the node agents
    listed = False  # the cluster's ResourceClaims were read (a file says so by holding some)
    if args.source:
        items = read_documents(args.source, stdin, stderr, what="objects")
        source = "standard input" if args.source == "-" else args.source
        if args.namespace:
            items = [i for i in items if _namespace(i) in (args.namespace, None)]
        policy = read_policy(Path(args.policy)) if args.policy else DEFAULT_POLICY
    else:
        items, policy, notes, usage, listed = _from_cluster(args)
        source = "the cluster"
    if args.namespace:
        notes.append(f"only namespace {args.namespace}: the GPU memory used counts its pods only")
    objects = sort_objects(items, source)
    objects.claims_listed |= listed
    report = build_report(objects, policy, now=clock(), usage=usage)
    if notes:
        report = dataclasses.replace(report, notes=(*notes, *report.notes))
    emit(args.output, lambda: as_json(report), lambda: as_table(report), stdout)
    return EXIT_OK if report.clean else EXIT_REJECTED


def _namespace(item: Any) -> str | None:
    meta = item.get("metadata") if isinstance(item, dict) else None
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return namespace if isinstance(namespace, str) else None


Usage = dict[tuple[str, str], int]


def _usage(api: Any, args: argparse.Namespace, notes: list[str]) -> Usage:
    """GPU memory used per pod (namespace, name), as the node agents report it."""
    from webhook.report.top import used_by_pod

    reports = agent_reports(api, args)
    for node, report in sorted(reports.items()):
        if isinstance(report, str):  # one node's agent away: the others still count
            notes.append(f"node {node}: GPU use not read ({report})")
    return used_by_pod(reports)


def _from_cluster(
    args: argparse.Namespace,
) -> tuple[list[Any], Policy, list[str], Usage, bool]:
    from webhook.cluster import inventory, kube

    api = kube.api_client(args.kubeconfig, args.context)
    items, notes = inventory.read_objects(api, namespace=args.namespace)
    try:
        usage = _usage(api, args, notes)
    except KubeError as error:  # the agents cannot be listed: the rest of the report stands
        notes.append(f"GPU use not read: {error}")
        usage = {}
    policy = cluster_policy(api, args, notes)
    claims = policy.placed_by.claims
    found, said, listed = inventory.read_dra(api, namespace=args.namespace, claims=claims)
    return [*items, *found], policy, [*notes, *said], usage, listed


def cluster_policy(api: Any, args: argparse.Namespace, notes: list[str]) -> Policy:
    """``--policy``'s file, else the policy ConfigMap's; the built-in one, with a note, when
    the ConfigMap cannot be read (for ``report`` and ``top``)."""
    from webhook.cluster import inventory

    if args.policy:
        return read_policy(Path(args.policy))
    namespace, _, name = args.policy_configmap.partition("/")
    if not name:
        raise InputError(f"--policy-configmap {args.policy_configmap!r}: expected NAMESPACE/NAME")
    text = inventory.read_policy_text(api, namespace, name)
    if text is None:
        notes.append(
            f"the policy ConfigMap {args.policy_configmap} could not be read: judged by the "
            "built-in defaults (give --policy FILE to judge by another)"
        )
        return DEFAULT_POLICY
    return parse_policy_text(text, source=f"ConfigMap {args.policy_configmap}")


def emit(output: str, data: Callable[[], Any], text: Callable[[], str], stdout: TextIO) -> None:
    """The answer as JSON (``--output json``) or as the table a person reads."""
    if output == "json":
        json.dump(data(), stdout, indent=2)
        stdout.write("\n")
    else:
        stdout.write(text())


def agent_reports(api: Any, args: argparse.Namespace) -> dict[str, list[Used] | str]:
    """Per node: what its agent reports, or why it could not be read."""
    from webhook.cluster.nodepods import agent_metrics, list_pods
    from webhook.node.scraped import containers  # prometheus_client's parser: only here

    reports: dict[str, list[Used] | str] = {}
    for agent in list_pods(api, namespace=args.agent_namespace, selector=args.agent_selector):
        node = (agent.get("spec") or {}).get("nodeName")
        name = (agent.get("metadata") or {}).get("name")
        if not node or not name:
            continue
        try:
            reports[node] = containers(
                agent_metrics(api, args.agent_namespace, name, args.agent_port)
            )
        except (KubeError, InputError) as error:  # one node's agent away: the others still count
            reports[node] = f"agent {args.agent_namespace}/{name}: {error}"
    return reports
