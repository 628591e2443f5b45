"""The node agent: what runs on every GPU node, as a DaemonSet of the webhook's own image.

Owns putting the shim library where the policy's ``shim.hostPath`` says
(``install``), keeping the node's label that says it is there (``agent``),
and reading HAMi-core's accounting regions from the host (``regions``) into
per-container usage (``usage``) served as metrics (``exporter``). It reads
and writes files under host directories mounted into its pod; the label and
the node's pods come through ``webhook.cli``, whose ``webhook.cluster`` is
the only package with the Kubernetes client.

May import ``webhook.decision`` and ``webhook.errors``; only ``webhook.cli``
imports it.
"""
