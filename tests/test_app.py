"""The HTTP layer through Flask's test client: statuses, content types, sizes, versions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.helpers import container, decode_patch, pod, review
from webhook.serving.app import MAX_BODY, create_app


@pytest.fixture
def client() -> FlaskClient:
    return create_app().test_client()


def post(client: FlaskClient, body: Any, content_type: str = "application/json") -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/mutate", data=data, content_type=content_type)


def test_gpu_pod_is_patched(client: FlaskClient) -> None:
    resp = post(client, review(pod(container(gpu="4"))))
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["response"]["allowed"] is True
    assert body["response"]["patchType"] == "JSONPatch"
    assert decode_patch(body["response"])


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_answers_in_the_request_version(client: FlaskClient, version: str) -> None:
    body = post(client, review(pod(container("web")), version=version)).get_json()
    assert body["apiVersion"] == f"admission.k8s.io/{version}"
    assert body["response"] == {"uid": "7f0d2c4e-1b7a-4c55-9a8e-3f1f9d2b6a01", "allowed": True}


def test_rejection_is_403_in_band(client: FlaskClient) -> None:
    resp = post(client, review(pod(container(gpu="64"))))
    assert resp.status_code == 200
    status = resp.get_json()["response"]["status"]
    assert status["code"] == 403
    assert "64 GiB" in status["message"]


BAD_BODIES = [
    (b"", "empty body"),
    (b"{", "not valid JSON"),
    (b"\xff\xfe", "not"),
    (b"[]", "must be a JSON object"),
    (b'"review"', "must be a JSON object"),
    (json.dumps({"kind": "AdmissionReview", "apiVersion": "v1"}).encode(), "apiVersion is 'v1'"),
    (json.dumps({"kind": "Pod", "apiVersion": "admission.k8s.io/v1"}).encode(), "kind is 'Pod'"),
    (
        json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(),
        "request is missing",
    ),
    (
        json.dumps({**review(None), "request": {**review(None)["request"], "uid": ""}}).encode(),
        "request.uid",
    ),
    (
        json.dumps({**review(None), "request": {**review(None)["request"], "uid": 5}}).encode(),
        "request.uid",
    ),
    (
        json.dumps(
            {**review(None), "request": {**review(None)["request"], "kind": "Pod"}}
        ).encode(),
        "request.kind",
    ),
    (
        json.dumps(
            {**review(None), "request": {**review(None)["request"], "operation": None}}
        ).encode(),
        "request.operation",
    ),
    (
        json.dumps(
            {**review(None), "request": {**review(None)["request"], "namespace": 3}}
        ).encode(),
        "request.namespace",
    ),
    (b"[" * 100000, "nested too deeply"),
    (b'{"a": NaN}', "kind is missing"),
]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES, ids=[m for _, m in BAD_BODIES])
def test_bad_bodies_get_400_with_a_json_error(
    client: FlaskClient, body: bytes, message: str
) -> None:
    resp = post(client, body)
    assert resp.status_code == 400
    assert message in resp.get_json()["error"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_wrong_content_type_is_415(client: FlaskClient, content_type: str) -> None:
    resp = post(client, review(pod()), content_type=content_type)
    assert resp.status_code == 415
    assert "application/json" in resp.get_json()["error"]


def test_oversized_body_is_413(client: FlaskClient) -> None:
    resp = post(client, b" " * (MAX_BODY + 1))
    assert resp.status_code == 413
    assert "larger than" in resp.get_json()["error"]


@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        ({"Content-Length": "12abc"}, 400, "not a number of bytes"),
        ({"Content-Length": "-5"}, 400, "not a number of bytes"),
        ({"Content-Length": str(MAX_BODY + 1)}, 413, "larger than"),
    ],
)
def test_declared_lengths_are_checked_before_reading(
    client: FlaskClient, headers: dict[str, str], status: int, says: str
) -> None:
    environ = {"CONTENT_LENGTH": headers["Content-Length"], "CONTENT_TYPE": "application/json"}
    resp = client.post("/mutate", data=b"{}", environ_overrides=environ)
    assert resp.status_code == status
    assert says in resp.get_json()["error"]


def test_charset_parameter_is_still_json(client: FlaskClient) -> None:
    resp = post(client, review(pod()), content_type="Application/JSON; charset=utf-8")
    assert resp.status_code == 200


def test_mutate_names_its_method(client: FlaskClient) -> None:
    resp = client.get("/mutate")
    assert resp.status_code == 405
    assert resp.headers["Allow"] == "POST"
    assert "POST" in resp.get_json()["error"]


def test_small_limit_is_derived_not_guessed() -> None:
    assert MAX_BODY == 7 * 1024 * 1024


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/mutate", 405), ("POST", "/healthz", 405), ("GET", "/nope", 404)],
)
def test_routing_errors_are_json(client: FlaskClient, method: str, path: str, status: int) -> None:
    resp = client.open(path, method=method)
    assert resp.status_code == status
    assert "error" in resp.get_json()


def test_health_and_readiness(client: FlaskClient) -> None:
    assert client.get("/healthz").get_json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200


def test_object_that_is_not_a_pod_is_denied_with_400(client: FlaskClient) -> None:
    body = post(client, review(["not", "a", "pod"])).get_json()
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 400
