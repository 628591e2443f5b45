"""The floor: the least a webhook can do, served exactly like gpushare-webhook.

A Flask app that parses each body with ``json.loads`` and returns a fixed
small AdmissionReview, run under the same gunicorn settings and TLS as
``gpushare-webhook serve`` (``webhook.serving.server.WebhookServer``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flask import Flask, Response, request

from webhook.serving.server import ServeOptions, WebhookServer


def create_floor() -> Flask:
    app = Flask("floor")

    @app.post("/mutate")
    def mutate() -> Response:
        review = json.loads(request.get_data(cache=False))
        uid = review["request"]["uid"]
        body = {
            "apiVersion": review["apiVersion"],
            "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": True},
        }
        return Response(json.dumps(body), mimetype="application/json")

    @app.get("/readyz")
    def readyz() -> Response:
        return Response("{}", mimetype="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--worker-class", default=ServeOptions.worker_class)
    args = parser.parse_args()
    options = ServeOptions(
        bind=args.bind,
        cert=Path(args.cert),
        key=Path(args.key),
        log_level="warning",
        worker_class=args.worker_class,
    )
    WebhookServer(create_floor(), options).run()


if __name__ == "__main__":
    main()
