"""One label on the agent's own Node: set it to a value, or remove it.

Owns the merge patch of ``metadata.labels`` (a JSON merge patch: a null
removes the key, and a Node without labels is no special case) and what a
refusal means. The ServiceAccount may patch Nodes; a
ValidatingAdmissionPolicy (manifests/base/node-agent.yaml) holds it to
this one label of the Node its pod runs on.
"""

from __future__ import annotations

import json

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.cluster import kube
from webhook.errors import KubeError


def _denied_by_policy(error: BaseException | None) -> str:
    """The API server's reason when an admission policy, not RBAC, refused the patch."""
    if not isinstance(error, ApiException) or not error.body:
        return ""
    try:
        message = json.loads(error.body).get("message", "")
    except (ValueError, AttributeError):
        return ""
    return str(message) if "ValidatingAdmissionPolicy" in str(message) else ""


RBAC = "the ClusterRole in manifests/base/node-agent.yaml"


class NodeLabel:
    """``key`` on Node ``node``, patched through ``api``."""

    def __init__(self, api: client.ApiClient, node: str, key: str) -> None:
        self.api, self.node, self.key = api, node, key

    def set(self, value: str | None) -> None:
        """Set the label to ``value``; None removes it (a no-op where it is absent)."""
        body = {"metadata": {"labels": {self.key: value}}}

        def patch() -> None:
            method, url, headers, payload, post = self.api.param_serialize(
                method="PATCH",
                resource_path=f"/api/v1/nodes/{self.node}",
                header_params={
                    "Content-Type": "application/merge-patch+json",
                    "Accept": "application/json",
                },
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(method, url, headers, payload, post, _request_timeout=30)
            answer = response.read().decode("utf-8", "replace")
            if not 200 <= response.status <= 299:
                raise ApiException(status=response.status, reason=response.reason, body=answer)

        try:
            kube.call(f"node {self.node}", "patch", "nodes", patch, rbac=RBAC)
        except KubeError as error:
            reason = _denied_by_policy(error.__context__)
            if not reason:
                raise
            raise KubeError(
                f"an admission policy refused to patch node {self.node}: {reason}"
            ) from None

    def get(self) -> str | None:
        """The label's value now, None when the Node has no such label."""

        def read() -> str | None:
            response = kube.get_json(self.api, f"/api/v1/nodes/{self.node}", {}, timeout=30)
            labels = json.loads(response.read()).get("metadata", {}).get("labels") or {}
            value = labels.get(self.key)
            return value if isinstance(value, str) else None

        return kube.call(f"node {self.node}", "get", "nodes", read, rbac=RBAC)
