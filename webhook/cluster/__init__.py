"""Cluster: everything that talks to the Kubernetes API.

Owns the kubernetes client (imported here and nowhere else): ``kube``
sets it up and explains failed calls, ``certs`` publishes the serving
certificate and caBundle (``certs install``), ``informer`` watches Nodes
for the GPU sizes the decision bounds requests by (and, ``watches``, the
ResourceSlices and DeviceClasses of ``scheduler: dra``), ``templates``
makes the claim templates pending pods name, ``watchprocess`` runs
those watches in a process of its own and shares them as a snapshot file, and
``incluster`` lists a node's pods for the node agent without the client.

May import: ``webhook.decision``, ``webhook.tls``, ``webhook.errors``. Not
``webhook.serving`` and not the CLI.
"""
