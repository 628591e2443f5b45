"""The HTTP layer: the only module that imports Flask.

Owns routing, content-type and size checks, and turning every HTTP-level
failure into a JSON error. The admission itself is ``webhook.decision.admission``;
this module only moves bytes in and out.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from flask import Flask, Response
from werkzeug.exceptions import HTTPException

from webhook.decision import NodeSource, NoNodes, Result, admit
from webhook.serving.runtime import PolicySource

if TYPE_CHECKING:
    from webhook.serving.metrics import Metrics

# etcd and the apiserver cap an object at 3 MiB (--max-request-bytes);
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
    alive: Callable[[], tuple[bool, str]] = lambda: (True, "ok")
    metrics: Metrics | None = None


def _json(status: int, payload: object) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def create_app(state: State | None = None, *, max_body: int = MAX_BODY) -> Flask:
    """Build the webhook's WSGI app around ``state`` (defaults: default policy, no nodes)."""
    state = state or State()
    app = Flask("gpushare_webhook")
    app.config["MAX_CONTENT_LENGTH"] = max_body
    app.config["MAX_FORM_MEMORY_SIZE"] = max_body

    @app.get("/healthz")
    def healthz() -> Response:
        ok, why = state.alive()
        if ok:
            return _json(200, {"status": "ok"})
        return _json(503, {"status": "unhealthy", "reason": why})

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

    # /mutate never reaches Flask: Mutate answers it in front, its own failures
    # in-band. This catches a bug in the other routes (health, readiness, metrics).
    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Response:  # pragma: no cover - no route raises today
        log.exception("unhandled error")
        return _json(400, {"error": f"request could not be handled: {type(error).__name__}"})

    app.wsgi_app = Mutate(app.wsgi_app, state, max_body)  # type: ignore[method-assign]
    return app


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Any]
_STATUS_LINES = {int(s): f"{int(s)} {s.phrase}" for s in HTTPStatus}
Answer = tuple[int, bytes, list[tuple[str, str]]]  # status, body, extra headers


class Mutate:
    """``/mutate`` as bare WSGI, in front of Flask (its documented middleware hook).

    Admission is the one path every GPU pod waits on. Flask's request and
    response objects cost about as much as reading the review (see bench/),
    so this path reads the body and writes the answer itself, with the same
    checks and JSON errors as Flask's; every other path goes to Flask.
    """

    def __init__(self, flask_app: WSGIApp, state: State, max_body: int) -> None:
        self.flask_app, self.state, self.max_body = flask_app, state, max_body

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") != "/mutate":
            return self.flask_app(environ, start_response)
        status, body, extra = self.respond(environ)
        start_response(
            _STATUS_LINES[status],
            [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *extra],
        )
        return [body]

    def respond(self, environ: dict[str, Any]) -> Answer:
        if environ.get("REQUEST_METHOD") != "POST":
            status, message, _ = _error(405, "use POST to send an AdmissionReview")
            return status, message, [("Allow", "POST")]
        started = time.perf_counter()
        mimetype = environ.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()
        if mimetype != "application/json":
            return _error(
                415,
                f"Content-Type is {mimetype or 'missing'!r}; "
                "send an AdmissionReview as application/json",
            )
        body = self._read(environ)
        if isinstance(body, tuple):
            return body  # the error answer
        state = self.state
        prepared = state.nodes.prepared(state.policy.get())
        result = admit(body, prepared)
        elapsed = time.perf_counter() - started
        if state.metrics is not None:
            state.metrics.observe(result, elapsed, fallback=bool(prepared.note))
        log_admission(result, elapsed)
        return result.status, result.encode(), []

    def _read(self, environ: dict[str, Any]) -> bytes | Answer:
        """The body, or an error: a declared length over the limit is refused unread."""
        stream = environ["wsgi.input"]
        declared = environ.get("CONTENT_LENGTH")
        if declared:
            try:
                length = int(declared)
            except ValueError:
                length = -1
            if length < 0:
                return _error(400, f"Content-Length is {declared!r}, not a number of bytes")
            if length > self.max_body:
                return self._too_big()
            data: bytes = stream.read(length)
            return data
        if environ.get("wsgi.input_terminated"):  # chunked: read up to the limit, no further
            data = stream.read(self.max_body + 1)
            return self._too_big() if len(data) > self.max_body else data
        return b""

    def _too_big(self) -> Answer:
        return _error(
            413, f"body larger than {self.max_body} bytes; an AdmissionReview is never this big"
        )


def _error(status: int, message: str) -> Answer:
    return status, json.dumps({"error": message}).encode(), []


def log_admission(result: Result, seconds: float) -> None:
    """One line per review: who, what was decided and why, how long. Never the pod itself."""
    if result.trace:
        log.error("admission of %s/%s failed: %s", result.namespace, result.name, result.trace)
    outcome = result.outcome
    level = logging.WARNING if outcome in ("error", "bad-request") else logging.INFO
    if not audit.isEnabledFor(level):
        return
    decision = result.decision
    fields: dict[str, Any] = {
        "uid": result.uid,
        "namespace": result.namespace,
        "pod": result.name,
        "decision": outcome,
        "reason": result.reason.value,
        "duration_ms": round(seconds * 1000, 3),
    }
    if decision is not None and len(decision.problems) > 1:
        fields["reasons"] = list(decision.reasons)
    if decision is not None and decision.gpu_pod.held_per_pod:
        fields["gpu_memory_per_gpu"] = decision.gpu_pod.held_per_gpu
        fields["gpu_memory_per_pod"] = decision.gpu_pod.held_per_pod
    if decision is not None and decision.warnings:
        fields["warnings"] = len(decision.warnings)
    if result.dry_run:
        fields["dry_run"] = True
    if decision is not None and decision.message:
        fields["detail"] = decision.message[:500]
    if result.error:
        fields["error"] = result.error[:300]
    audit.log(level, "admission", extra={"fields": fields})
