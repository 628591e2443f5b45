"""The node agent: what runs on every GPU node, as a DaemonSet of the webhook's own image.

Owns putting the shim library where the policy's ``shim.hostPath`` says
(``install``) and keeping the node's label that says it is there
(``agent``). It reads and writes files under one host directory mounted
into its pod; the label goes through ``webhook.cluster``, the only package
with the Kubernetes client.

May import ``webhook.cluster``, ``webhook.decision`` and ``webhook.errors``;
only ``webhook.cli`` imports it.
"""
