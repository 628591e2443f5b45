"""AdmissionReview on the wire, as TypedDicts with the real camelCase keys.

Owns the shape of ``admission.k8s.io/v1`` (and ``v1beta1``, which has the
same fields) requests and responses. Types only: no behaviour. A response
holds its patch as ops until ``webhook.decision.responses.encode`` writes
it as base64 of their JSON.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from webhook.decision.patch import Op

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class Request(TypedDict):
    uid: str
    kind: GroupVersionKind
    resource: NotRequired[GroupVersionResource]
    subResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: Operation
    userInfo: NotRequired[dict[str, Any]]
    object: NotRequired[Any]
    oldObject: NotRequired[Any]
    dryRun: NotRequired[bool]
    options: NotRequired[Any]


class Status(TypedDict):
    code: int
    message: str
    reason: NotRequired[str]


class Response(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str | tuple[Op, ...]]  # ops until responses.encode writes them
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class Review(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    request: NotRequired[Request]
    response: NotRequired[Response]
