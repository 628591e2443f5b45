"""``gpushare-webhook top``: GPU memory per node, per GPU, per pod: reserved, limit, used now.

Reads every pod from the API, finds the node agents (``node metrics``) by
their label and reads each one's metrics through the API server's pod
proxy, so it needs no Prometheus and no route to the nodes; under
``scheduler: dra`` it lists the ResourceClaims and ResourceSlices too, for
what each claim holds on each device (a note when it may not); prints a
table, as ``kubectl top`` does, or JSON. Exit 0, or 1 when a node with GPU
pods could not be asked or a region was tampered with; 2 on an error.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from webhook.cli.args import EXIT_OK, EXIT_REJECTED, add_agent_arguments
from webhook.cli.report import agent_reports, cluster_policy, emit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", "-o", choices=("table", "json"), default="table", help="default: %(default)s"
    )
    parser.add_argument(
        "--namespace", "-n", default="", metavar="NS", help="only this namespace's pods"
    )
    parser.add_argument("--policy", metavar="FILE", help="the policy (default: the cluster's)")
    parser.add_argument(
        "--policy-configmap",
        default="gpushare-system/gpushare-webhook-policy",
        metavar="NS/NAME",
        help="where the cluster's policy is (default: %(default)s)",
    )
    add_agent_arguments(parser)
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube)")
    parser.add_argument("--context", help="kubeconfig context")


def cmd_top(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from webhook.cluster import inventory, kube
    from webhook.cluster.nodepods import list_pods
    from webhook.report.claims import NO_CLAIMS, read_claims
    from webhook.report.objects import sort_objects
    from webhook.report.top import as_json, as_table, build_top

    api = kube.api_client(args.kubeconfig, args.context)
    policy = cluster_policy(api, args, [])
    pods = list_pods(api, namespace=args.namespace)
    claims = NO_CLAIMS
    if policy.placed_by.claims:
        found, notes, listed = inventory.read_dra(api, namespace=args.namespace, claims=True)
        for note in notes:
            print(f"note: {note}", file=stderr)
        if listed:
            objects = sort_objects(found, "the cluster")
            claims = read_claims(pods, objects.claims, objects.slices, policy)
    top = build_top(pods, policy, agent_reports(api, args), claims)
    emit(args.output, lambda: as_json(top), lambda: as_table(top), stdout)
    return EXIT_OK if top.clean else EXIT_REJECTED
