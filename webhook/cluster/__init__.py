"""Cluster: everything that talks to the Kubernetes API.

Owns the kubernetes client (imported here and nowhere else), publishing the
serving certificate and caBundle (``certs install``) and the watch of
Nodes that gives the decision the cluster's GPU sizes.

May import: ``webhook.decision``, ``webhook.tls``, ``webhook.errors``. Not
``webhook.serving`` and not the CLI.
"""
