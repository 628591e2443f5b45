"""The floor: the least a webhook can do, served exactly like gpushare-webhook.

A Flask app that parses each body with ``json.loads`` and returns a fixed
small AdmissionReview, run under the same gunicorn settings and TLS as
``gpushare-webhook serve`` (``webhook.serving.server.WebhookServer``).
With ``--patch one`` or ``--patch many`` the answer carries a fixed
JSON Patch that adds ``--ops`` annotations to the pod: in one op, or in
one op each. Both leave the same object, so the API server's time
between the two is what it spends per op of a patch.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

from flask import Flask, Response, request

from webhook.serving.server import ServeOptions, WebhookServer


def fixed_patch(shape: str, ops: int) -> str:
    """A patch adding ``ops`` annotations, in one op or one op each; "" for none."""
    if shape == "none":
        return ""
    names = [f"bench.gpushare-webhook.io/a{index}" for index in range(ops)]
    if shape == "one":
        patch = [{"op": "add", "path": "/metadata/annotations", "value": dict.fromkeys(names, "x")}]
    else:
        patch = [{"op": "add", "path": "/metadata/annotations", "value": {names[0]: "x"}}]
        patch += [
            {"op": "add", "path": "/metadata/annotations/" + name.replace("/", "~1"), "value": "x"}
            for name in names[1:]
        ]
    return base64.b64encode(json.dumps(patch).encode()).decode()


def create_floor(patch: str = "") -> Flask:
    app = Flask("floor")
    extra = {"patchType": "JSONPatch", "patch": patch} if patch else {}

    @app.post("/mutate")
    def mutate() -> Response:
        review = json.loads(request.get_data(cache=False))
        uid = review["request"]["uid"]
        body = {
            "apiVersion": review["apiVersion"],
            "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": True, **extra},
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
    parser.add_argument("--patch", choices=("none", "one", "many"), default="none")
    parser.add_argument("--ops", type=int, default=36)
    args = parser.parse_args()
    options = ServeOptions(
        bind=args.bind,
        cert=Path(args.cert),
        key=Path(args.key),
        log_level="warning",
        worker_class=args.worker_class,
    )
    WebhookServer(create_floor(fixed_patch(args.patch, args.ops)), options).run()


if __name__ == "__main__":
    main()
