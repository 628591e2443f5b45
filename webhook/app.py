"""The HTTP layer: the only module that imports Flask.

Owns routing, content-type and size checks, and turning every HTTP-level
failure into a JSON error. The admission itself is ``webhook.admission``;
this module only moves bytes in and out.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from webhook.admission import Result, admit
from webhook.runtime import NodeSource, NoNodes, PolicySource

if TYPE_CHECKING:
    from webhook.metrics import Metrics

# NB: etcd and the apiserver cap an object at 3 MiB (--max-request-bytes);
# a review carries the object and, on UPDATE, the old object too. Like
# controller-runtime, allow both at full size plus 1 MiB for the envelope.
MAX_BODY = 7 * 1024 * 1024

log = logging.getLogger("gpushare_webhook.app")
audit = logging.getLogger("gpushare_webhook.admission")


@dataclass
class State:
    """What the app reads per request; each gunicorn worker has its own."""

    policy: PolicySource = field(default_factory=PolicySource)
    nodes: NodeSource = field(default_factory=NoNodes)
    ready: Callable[[], tuple[bool, str]] = lambda: (True, "ok")
    metrics: Metrics | None = None


def _json(status: int, payload: object) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def create_app(state: State | None = None, *, max_body: int = MAX_BODY) -> Flask:
    """Build the webhook's WSGI app around ``state`` (defaults: default policy, no nodes)."""
    state = state or State()
    app = Flask("gpushare_webhook")
    app.config["MAX_CONTENT_LENGTH"] = max_body
    app.config["MAX_FORM_MEMORY_SIZE"] = max_body

    @app.post("/mutate")
    def mutate() -> Response:
        started = time.perf_counter()
        if request.mimetype != "application/json":
            return _json(
                415,
                {
                    "error": f"Content-Type is {request.mimetype or 'missing'!r}; "
                    "send an AdmissionReview as application/json"
                },
            )
        # Werkzeug refuses a declared Content-Length over the limit before
        # reading, and stops a chunked body at the limit.
        body = request.get_data(cache=False)
        policy = state.policy.get()
        view = state.nodes.view(policy)
        result = admit(body, policy, view.nodes, note=view.note)
        elapsed = time.perf_counter() - started
        if state.metrics is not None:
            state.metrics.observe(result, elapsed, fallback=bool(view.note), policy=policy)
        _log_admission(result, elapsed)
        return Response(result.encode(), status=result.status, mimetype="application/json")

    @app.get("/healthz")
    def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        ok, why = state.ready()
        return _json(200 if ok else 503, {"status": "ready" if ok else "not ready", "reason": why})

    @app.get("/metrics")
    def metrics() -> Response:
        if state.metrics is None:
            return _json(404, {"error": "metrics are off in this server"})
        page, content_type = state.metrics.render()
        return Response(page, status=200, content_type=content_type)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        code = error.code or 400
        message = error.description or error.name
        if code == 413:
            message = f"body larger than {max_body} bytes; an AdmissionReview is never this big"
        return _json(code, {"error": message})

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Response:  # pragma: no cover - admit() never raises
        log.exception("unhandled error")
        return _json(400, {"error": f"request could not be handled: {type(error).__name__}"})

    return app


def _log_admission(result: Result, seconds: float) -> None:
    """One line per review: who, what was decided and why, how long. Never the pod itself."""
    level = logging.WARNING if result.outcome in ("error", "bad-request") else logging.INFO
    if not audit.isEnabledFor(level):
        return
    decision = result.decision
    fields: dict[str, Any] = {
        "uid": result.uid,
        "namespace": result.namespace,
        "pod": result.name,
        "decision": result.outcome,
        "reason": decision.reason if decision else ("bad-request" if result.status != 200 else ""),
        "duration_ms": round(seconds * 1000, 3),
    }
    if decision is not None and decision.demand:
        fields["gpu_memory"] = decision.demand
    if decision is not None and decision.warnings:
        fields["warnings"] = len(decision.warnings)
    if result.dry_run:
        fields["dry_run"] = True
    if decision is not None and decision.message:
        fields["detail"] = decision.message[:500]
    if result.error:
        fields["error"] = result.error[:300]
    audit.log(level, "admission", extra={"fields": fields})
