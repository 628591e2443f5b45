"""The Kubernetes API client: set-up and failures that say what to fix.

Owns the client set-up (in-cluster, or a kubeconfig) and :func:`call`,
which turns API failures into messages that say which permission or object
is missing. The package's other modules (``certs``, ``informer``) make their
calls through it. The ``kubernetes`` import costs about 19 MiB per process,
so callers import this package only when they need the API.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from webhook.errors import KubeError

T = TypeVar("T")


def api_client(
    kubeconfig: str | None = None, context: str | None = None, *, retries: int | None = None
) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig.

    ``retries`` replaces urllib3's default of three quiet retries per call,
    each logged as a warning: a caller with its own backoff passes 0.
    """
    settings = client.Configuration()
    settings.retries = retries
    try:
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config(client_configuration=settings)
                return client.ApiClient(settings)
            except config.ConfigException:
                pass
        return config.new_client_from_config(
            config_file=kubeconfig, context=context, client_configuration=settings
        )
    except (config.ConfigException, OSError) as error:
        raise KubeError(f"no usable Kubernetes credentials: {error}") from None


def get_json(
    api: client.ApiClient,
    path: str,
    query: dict[str, str],
    *,
    timeout: float | tuple[float, float],
) -> Any:
    """GET ``path`` with its query; the response, status checked, body not yet read.

    For reads of one kind as plain JSON. The generated API classes
    import their pydantic models when first used: about 20 MiB for
    ``CoreV1Api``, in a process (the node watch) that needs a few fields of
    one kind. The request still goes through the client's own set-up: its
    authentication (tokens refreshed by exec plugins too), TLS and proxies.
    A status other than 2xx is an ApiException, as from a generated call.
    """
    query_params = [(k, v) for k, v in query.items() if v != ""]
    response = _call(api, "GET", path, timeout=timeout, query_params=query_params)
    if not 200 <= response.status <= 299:
        response.read()
        raise ApiException(status=response.status, reason=response.reason)
    return response


def post_json(
    api: client.ApiClient,
    path: str,
    body: dict[str, Any],
    *,
    timeout: float | tuple[float, float],
) -> Any:
    """POST ``body`` as JSON to ``path`` (a create), as :func:`get_json` reads; the response."""
    response = _call(api, "POST", path, timeout=timeout, body=body)
    if not 200 <= response.status <= 299:
        text = response.read()
        raise ApiException(status=response.status, reason=_message(text) or response.reason)
    return response


def _call(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    timeout: float | tuple[float, float],
    query_params: list[tuple[str, str]] | None = None,
    body: dict[str, Any] | None = None,
) -> Any:
    """One JSON request through the client's own set-up; the response, body not yet read."""
    header_params = {"Accept": "application/json"}
    if body is not None:
        header_params["Content-Type"] = "application/json"
    method, url, headers, data, post = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query_params,
        header_params=header_params,
        body=body,
        auth_settings=["BearerToken"],
    )
    return api.call_api(method, url, headers, data, post, _request_timeout=timeout)


def _message(body: bytes | None) -> str:
    """The message of the API's Status in an error's body ("" when there is none)."""
    try:
        status = json.loads(body or b"")
    except ValueError:
        return ""
    return str(status.get("message") or "") if isinstance(status, dict) else ""


def call(
    what: str,
    verb: str,
    resource: str,
    fn: Callable[[], T],
    *,
    rbac: str = "the Role in manifests/base/rbac.yaml",
) -> T:
    """Run one API call; explain RBAC denials (``rbac`` says where the grant is) and the rest."""
    try:
        return fn()
    except ApiException as error:
        if error.status == 403:
            raise KubeError(
                f"forbidden to {verb} {what}: grant the service account '{verb}' on {resource} "
                f"(see {rbac})"
            ) from None
        if error.status == 401:
            raise KubeError(
                f"unauthorized to {verb} {what}: the credentials were refused"
            ) from None
        raise KubeError(f"cannot {verb} {what}: HTTP {error.status} {error.reason}") from None
    except urllib3.exceptions.HTTPError as error:
        raise KubeError(f"cannot reach the Kubernetes API to {verb} {what}: {error}") from None


def not_found(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except ApiException as error:
        if error.status == 404:
            return None
        raise
