"""Serving: the webhook as an HTTPS process.

Owns the WSGI app, the gunicorn integration and its buffering worker, the
TLS context that follows the certificate files, the live policy, the
node watch's snapshot as the workers read it, metrics and logs. Flask,
gunicorn and prometheus_client are imported here and nowhere else.

May import: ``webhook.decision``, ``webhook.tls``, ``webhook.errors``. Not
``webhook.cluster`` (node facts reach it through the ``NodeSource``
protocol of ``webhook.decision.nodesource``, as a snapshot file the node watch
writes) and not the CLI.
"""
