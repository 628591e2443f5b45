"""The floor: the least a webhook can do, served exactly like gpushare-webhook.

A Flask app that parses each body with ``json.loads`` and returns a fixed
small AdmissionReview, run under the same gunicorn settings and TLS as
``gpushare-webhook serve`` (``webhook.serving.server.WebhookServer``).
With ``--patch one`` or ``--patch many`` the answer carries a fixed
JSON Patch that adds ``--ops`` annotations to the pod: in one op, or in
one op each. Both leave the same object, so the API server's time
between the two is what it spends per op of a patch. With ``--like URL``
it answers every review as the webhook at URL answered the first one of
its namespace (asked once per worker and namespace, the uid its own): the API server does
all it does for that webhook's answer, and the floor none of its work.
"""

from __future__ import annotations

import argparse
import base64
import json
import ssl
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask, Response, request

from webhook.decision import STATUS_ANNOTATION
from webhook.serving.server import DEFAULT_IDLE_TIMEOUT, ServeOptions, WebhookServer


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


Kind = tuple[str, bool]  # a review's namespace, and whether its pod is set up already
Answer = Callable[[bytes, Kind], dict[str, Any]]


def kind_of(review: dict[str, Any]) -> Kind:
    """What makes two reviews alike: the namespace, and whether the webhook set the pod up.

    By namespace: the pods of one are alike, and the readiness probe's
    review (another pod, no namespace) is not the API server's. A pod the
    webhook has set up is a reinvocation (an admission plugin changed the
    pod after the webhook, as the ServiceAccount plugin does to the init
    step), which the webhook answers without a patch.
    """
    asked = review["request"]
    meta = (asked.get("object") or {}).get("metadata") or {}
    return asked.get("namespace", ""), STATUS_ANNOTATION in (meta.get("annotations") or {})


def answered_like(url: str, ca: Path) -> Answer:
    """The response the webhook at ``url`` gives the first review of a kind, kept for the rest."""
    context = ssl.create_default_context(cafile=str(ca))
    kept: dict[Kind, dict[str, Any]] = {}

    def answer(body: bytes, kind: Kind) -> dict[str, Any]:
        if kind not in kept:  # two first reviews at once ask twice and keep one answer
            asked = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(asked, context=context, timeout=5) as reply:
                kept[kind] = json.loads(reply.read())["response"]
        return kept[kind]

    return answer


def create_floor(patch: str = "", like: Answer | None = None) -> Flask:
    app = Flask("floor")
    extra = {"patchType": "JSONPatch", "patch": patch} if patch else {}

    @app.post("/mutate")
    def mutate() -> Response:
        raw = request.get_data(cache=False)
        review = json.loads(raw)
        uid = review["request"]["uid"]
        if like:
            response = {**like(raw, kind_of(review)), "uid": uid}
        else:
            response = {"uid": uid, "allowed": True, **extra}
        body = {
            "apiVersion": review["apiVersion"],
            "kind": "AdmissionReview",
            "response": response,
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
    parser.add_argument("--like", metavar="URL", help="answer as the webhook at URL answers")
    parser.add_argument("--like-ca", type=Path, help="the CA of the webhook at --like")
    args = parser.parse_args()
    if args.like and not args.like_ca:
        parser.error("--like needs --like-ca, the CA of the webhook it asks")
    options = ServeOptions(
        bind=args.bind,
        cert=Path(args.cert),
        key=Path(args.key),
        log_level="warning",
        worker_class=args.worker_class,
        # Idle connections kept as long as the webhook keeps them (longer than
        # the API server does), so neither loses a create to a closing one.
        keepalive=DEFAULT_IDLE_TIMEOUT,
        drain=0.0,  # a bench's floor stops at once
    )
    like = answered_like(args.like, args.like_ca) if args.like else None
    WebhookServer(create_floor(fixed_patch(args.patch, args.ops), like), options).run()


if __name__ == "__main__":
    main()
