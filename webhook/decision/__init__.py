"""The decision: what to answer for one AdmissionReview, as pure functions of their arguments.

Owns everything a rule depends on: quantities, the policy model, the GPU
bounds of a pod's placement, reading a pod's asks, the confinement checks
(every refusal), the injection (scheduler, volume, mounts, env) and the
patch, and the AdmissionReview envelope in and out.

May import: the standard library, ``webhook.errors``. Never Flask,
gunicorn, cryptography, kubernetes or prometheus_client, and nothing of
``webhook.serving``, ``webhook.cluster`` or the CLI: it reads no file, clock
or socket, so the webhook, the offline preview and the benchmarks all run
exactly this code (import-linter checks it; see pyproject.toml).
"""
