"""The report: which GPU pods and workloads of a cluster are confined, and which slipped past.

Owns ``gpushare-webhook report``'s judgement, pure like the decision it
reuses: the objects of a cluster (pods, workloads, nodes, as the API
returns them) in, a :class:`~webhook.report.findings.Report` out, and its
table and JSON. Reading the cluster is ``webhook.cluster.inventory``'s;
the command line wires the two.

May import: ``webhook.preview``, ``webhook.decision``, ``webhook.errors``.
"""
