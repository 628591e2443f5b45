"""DRA's side of bench/scheduler.py: GPUs as ResourceSlices, claims from templates, the pods.

The nodes KWOK plays get a ResourceSlice each as NVIDIA's driver publishes
them with consumable shares (tests/controlplane/dra.py: one device per GPU,
``allowMultipleAllocations``, ``memory`` in bytes on a 1 MiB grid) and the
driver's DeviceClass. Two ways to the same claims:

- with the webhook (policy ``scheduler: dra``): the pod asks
  ``aliyun.com/gpu-mem`` and the webhook gives each GPU container a claim
  from the template its size names (``claims.template``); the templates a
  round's pods name are made in the namespace before the round, so no pod
  waits for one;
- without it, as a user writes it by hand: ``spec.resourceClaims`` from a
  ResourceClaimTemplate of that size made beforehand (the same body under
  the user's own name) and the container's ``resources.claims``, no
  extended resource.

Either way kube-controller-manager's resourceclaim controller makes each
pod's claim and writes the pod's status, kube-scheduler allocates it and
binds the pod; a round is over when the pods and their claims are gone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import yaml
from kubernetes import client

from tests.controlplane import dra
from webhook.decision.claims import template
from webhook.decision.policy import Policy

Call = Callable[[str, str, Any], tuple[int, Any]]  # (method, path, body) -> (status, answer)
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
CLAIM = "gpu"  # the pod's name for its claim, in the hand-written pods
# Client limits (qps, burst) a large cluster gives kube-controller-manager and kube-scheduler
# (--kube-api-qps/--kube-api-burst; clientConnection qps/burst): Kubernetes' own 5,000-node
# scalability jobs run both at 100.
RAISED_LIMITS = (100.0, 100)


def policy_text(shipped: str) -> str:
    """The shipped policy, with DRA placing the GPU pods."""
    document = yaml.safe_load(shipped)
    document["scheduler"] = "dra"
    return str(yaml.safe_dump(document, sort_keys=False))


def publish(admin: client.ApiClient, nodes: Iterable[str], gpus: int, gib: int) -> None:
    """The driver's DeviceClass and one ResourceSlice per node."""
    dra.device_class(admin)
    for node in nodes:
        dra.publish_gpus(admin, node, gpus=gpus, memory_gib=gib)


def webhook_template(gib: int, policy: Policy) -> str:
    """The template the webhook names for a one-GPU container asking ``gib`` GiB."""
    return f"gpushare-{gib * 1024}mi.{policy.dra.device_class}"


def user_template(gib: int) -> str:
    return f"gpu-{gib}gi"


def make_templates(call: Call, namespace: str, sizes: Iterable[int], policy: Policy) -> None:
    """Both sides' templates for every size: the webhook's names, and the user's own."""
    for gib in sorted(set(sizes)):
        body = template(webhook_template(gib, policy), policy)
        if body is None:
            raise RuntimeError(f"no template for {gib} GiB")
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
        user = {**body, "metadata": {"name": user_template(gib)}}
        for made in (body, user):
            name = made["metadata"]["name"]
            status, answer = call("POST", path, made)
            if status not in (201, 409):
                raise RuntimeError(f"cannot create template {name}: HTTP {status}: {answer}")


def hand_written_pod(name: str, gib: int) -> bytes:
    """The pod a user writes for ``gib`` GiB of one GPU under DRA, without the webhook."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {"name": "main", "image": IMAGE, "resources": {"claims": [{"name": CLAIM}]}}
                ],
                "resourceClaims": [
                    {"name": CLAIM, "resourceClaimTemplateName": user_template(gib)}
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
    ).encode()


def claims_left(call: Call, namespace: str) -> int:
    """How many ResourceClaims the namespace still holds (one asked for: 0 or more)."""
    status, listed = call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims?limit=1", None
    )
    if status != 200:
        raise RuntimeError(f"cannot list claims: HTTP {status}: {listed}")
    return len(listed["items"]) + int(listed["metadata"].get("remainingItemCount") or 0)
