"""Pods by node, and the node agents' metrics through the API server's pod proxy.

The node agent lists the pods of its own node (``fieldSelector=
spec.nodeName=<node>``, as the kubelet's own watch does: one node's worth
of JSON, whatever the size of the cluster). ``top`` lists every pod, finds
the agents by label and reads each one's ``/metrics`` through
``pods/proxy``, so it needs nothing but the API server to reach them.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from webhook.cluster import kube

RBAC = "the ClusterRole of the node agent or of top: list pods, get pods/proxy"
TIMEOUT = 10.0
PAGE = 500


def list_pods(
    api: client.ApiClient, *, node: str = "", selector: str = "", namespace: str = ""
) -> list[Any]:
    """Pods (of one node, matching a label selector, of one namespace), in pages."""
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    fields = f"spec.nodeName={node}" if node else ""

    def fetch() -> list[Any]:
        items: list[Any] = []
        cursor = ""
        while True:
            query = {
                "fieldSelector": fields,
                "labelSelector": selector,
                "limit": str(PAGE),
                "continue": cursor,
            }
            page = json.loads(kube.get_json(api, path, query, timeout=TIMEOUT).read())
            items += page.get("items") or []
            cursor = (page.get("metadata") or {}).get("continue") or ""
            if not cursor:
                return items

    what = f"pods on node {node}" if node else "pods"
    return kube.call(what, "list", "pods", fetch, rbac=RBAC)


def list_node_pods(api: client.ApiClient, node: str) -> list[Any]:
    """The pods bound to ``node``, every namespace; KubeError naming the fix on failure."""
    return list_pods(api, node=node)


def agent_metrics(api: client.ApiClient, namespace: str, pod: str, port: int) -> str:
    """One agent's ``/metrics`` text, through the API server's proxy to its pod."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics"

    def fetch() -> str:
        return str(kube.get_json(api, path, {}, timeout=TIMEOUT).read().decode())

    return kube.call(f"the metrics of {namespace}/{pod}", "get", "pods/proxy", fetch, rbac=RBAC)
