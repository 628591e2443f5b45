"""A node's pods through the pod's own service account, with the standard library only.

The node agent's metrics container lists the pods of its node every
``--refresh`` seconds, one GET. The kubernetes client would about double
the agent's memory for it (its modules are some 25 MiB resident, the whole
agent without them 24 MiB), so in a pod the agent reads the token and CA
the kubelet mounts for its service account and asks the API server itself,
as the client's in-cluster configuration would. With ``--kubeconfig`` it
uses the client (``webhook.cluster.nodepods``) instead.
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode
from urllib.request import Request, urlopen

from webhook.errors import KubeError

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the kubelet mounts it
PAGE = 500
TIMEOUT = 30.0


@dataclass(frozen=True)
class InCluster:
    """The API server as a pod sees it: its address and the service account's folder."""

    url: str
    folder: Path
    context: ssl.SSLContext


def in_cluster(folder: str = SERVICE_ACCOUNT) -> InCluster | None:
    """The pod's view of the API server; None outside a pod (no service host or no token)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    token = Path(folder) / "token"
    if not host or not token.is_file():
        return None
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    try:
        context = ssl.create_default_context(cafile=str(Path(folder) / "ca.crt"))
    except (OSError, ssl.SSLError) as error:
        raise KubeError(f"the service account's CA in {folder} cannot be used: {error}") from None
    address = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return InCluster(f"https://{address}:{port}", Path(folder), context)


def list_node_pods(source: InCluster, node: str) -> list[dict[str, Any]]:
    """The pods bound to ``node``, every namespace, page by page; KubeError in one line."""
    items: list[dict[str, Any]] = []
    cursor = ""
    while True:
        query = {"fieldSelector": f"spec.nodeName={node}", "limit": str(PAGE)}
        if cursor:
            query["continue"] = cursor
        page = _get(source, f"/api/v1/pods?{urlencode(query)}", f"the pods of node {node}")
        items += [{"apiVersion": "v1", "kind": "Pod", **item} for item in page.get("items") or ()]
        cursor = (page.get("metadata") or {}).get("continue") or ""
        if not cursor:
            return items


def _get(source: InCluster, path: str, what: str) -> dict[str, Any]:
    try:
        # Read each time: the kubelet rotates a bound token in place.
        token = (source.folder / "token").read_text().strip()
    except OSError as error:
        raise KubeError(f"cannot read the service account's token: {error}") from None
    request = Request(
        source.url + path,
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    try:
        with urlopen(request, context=source.context, timeout=TIMEOUT) as answer:
            found = json.load(answer)
    except HTTPError as error:
        hint = ": the service account needs list on pods" if error.code == 403 else ""
        raise KubeError(f"cannot list {what}: HTTP {error.code} {error.reason}{hint}") from None
    except (URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise KubeError(f"cannot list {what}: {reason}") from None
    if not isinstance(found, dict):
        raise KubeError(f"cannot list {what}: the API server's answer is not a list")
    return found
