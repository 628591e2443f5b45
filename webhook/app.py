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

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from webhook.admission import Result, admit
from webhook.runtime import NodeSource, NoNodes, PolicySource

# NB: etcd and the apiserver cap an object at 3 MiB (--max-request-bytes);
# a review carries the object and, on UPDATE, the old object too. Like
# controller-runtime, allow both at full size plus 1 MiB for the envelope.
MAX_BODY = 7 * 1024 * 1024

log = logging.getLogger("gpushare_webhook.app")


@dataclass
class State:
    """What the app reads per request; each gunicorn worker has its own."""

    policy: PolicySource = field(default_factory=PolicySource)
    nodes: NodeSource = field(default_factory=NoNodes)
    ready: Callable[[], tuple[bool, str]] = lambda: (True, "ok")
    observe: Callable[[Result, float], None] | None = None


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
        result = admit(body, state.policy.get(), state.nodes.nodes())
        if state.observe is not None:
            state.observe(result, time.perf_counter() - started)
        return Response(result.encode(), status=result.status, mimetype="application/json")

    @app.get("/healthz")
    def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        ok, why = state.ready()
        return _json(200 if ok else 503, {"status": "ready" if ok else "not ready", "reason": why})

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
