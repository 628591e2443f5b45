"""ResourceClaims as kube-scheduler leaves them for a pod the webhook set up under DRA.

What the resourceclaim controller makes from each of the pod's templates
(named ``<pod>-<entry>-<suffix>``, listed in the pod's
``status.resourceClaimStatuses``) and what the scheduler writes into each
claim's status on allocating it: one result per GPU the template asks,
each on a device of its own, consuming what the claim requests (or
``held``, for a scheduler that rounded it up). Used by the unit tests and
the API server's alike, so both build the same objects.
"""

from __future__ import annotations

from typing import Any

from webhook.decision.claims import PREFIX, template_shape
from webhook.decision.policy import Policy

DRIVER = "gpu.nvidia.com"
MIB = 2**20


def claim_entries(pod: dict[str, Any]) -> list[tuple[str, str]]:
    """(entry name, template name) of the webhook's claims in a pod's spec."""
    return [
        (e["name"], e["resourceClaimTemplateName"])
        for e in pod["spec"].get("resourceClaims") or ()
        if e["name"].startswith(PREFIX) and "resourceClaimTemplateName" in e
    ]


def allocate(
    pod: dict[str, Any],
    policy: Policy,
    *,
    pool: str = "gpu-a",
    held: dict[str, str] | None = None,
    first: int = 0,
) -> list[dict[str, Any]]:
    """The pod's claims, allocated; the pod's ``status.resourceClaimStatuses`` set to match.

    Each GPU of each claim is a device of its own, ``gpu-<n>`` from ``first``
    on; ``held``: entry name -> what its claim consumes, instead of its request.
    """
    claims, statuses = [], []
    device = first
    for entry, template in claim_entries(pod):
        shape = template_shape(template)
        assert shape is not None, template
        mib, gpus, _, device_class = shape
        name = f"{pod['metadata']['name']}-{entry}-x7k2q"
        results = []
        for _ in range(gpus):
            results.append(
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": pool,
                    "device": f"gpu-{device}",
                    "shareID": f"8c2f0b1e-0000-4000-8000-{device:012d}",
                    "consumedCapacity": {
                        policy.dra.memory_capacity: (held or {}).get(entry, f"{mib}Mi")
                    },
                }
            )
            device += 1
        claims.append(resource_claim(pod, name, device_class, results))
        statuses.append({"name": entry, "resourceClaimName": name})
    pod.setdefault("status", {})["resourceClaimStatuses"] = statuses
    return claims


def resource_claim(
    pod: dict[str, Any], name: str, device_class: str, results: list[dict[str, Any]]
) -> dict[str, Any]:
    meta = pod["metadata"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": meta.get("namespace", "")},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta.get("uid", "")}],
        },
    }


def resource_slice(node: str, devices: int, memory: str = "80Gi", pool: str = "") -> dict[str, Any]:
    """A ResourceSlice of ``node``: ``devices`` shared GPUs of ``memory`` each."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "memory": {
                            "value": memory,
                            "requestPolicy": {
                                "default": "1Mi",
                                "validRange": {"min": "1Mi", "step": "1Mi"},
                            },
                        }
                    },
                }
                for i in range(devices)
            ],
        },
    }
