"""Cluster: everything that talks to the Kubernetes API.

Owns the kubernetes client (imported here and nowhere else): ``kube``
sets it up and explains failed calls, ``certs`` publishes the serving
certificate and caBundle (``certs install``), ``informer`` watches Nodes
for the GPU sizes the decision bounds requests by, ``watchprocess`` runs
that watch in a process of its own and shares it as a snapshot file, and
``incluster`` lists a node's pods for the node agent without the client.

May import: ``webhook.decision``, ``webhook.tls``, ``webhook.errors``. Not
``webhook.serving`` and not the CLI.
"""
