"""DRA in the scheduling tier: GPUs published as a DRA driver publishes them, and claims read back.

No driver runs: KWOK plays the kubelets, so nothing would publish a
ResourceSlice. ``publish_gpus`` writes the one a node's kubelet plugin of
kubernetes-sigs/dra-driver-nvidia-gpu publishes with consumable shares in
``memory`` mode (``--consumable-shares=memory``): one pool per node, named
after it, one device per GPU with ``allowMultipleAllocations: true`` and a
``memory`` capacity in bytes whose request policy defaults to the whole
GPU and steps by 1 MiB. The API server validates it as it would the
driver's. ``device_class`` makes the DeviceClass the driver's chart
installs (optionally mapping an extended resource, KEP-5004).

kube-scheduler allocates the claims (its DynamicResources plugin, with
DRAConsumableCapacity on by default in v1.37) and kube-controller-manager's
resourceclaim controller (in ``--controllers=*``) makes each pod's claims
from their templates and deletes them with the pod. ``claims_of`` and
``results`` read back what was allocated: the device, pool and
``consumedCapacity`` of each result.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.helpers import eventually

GROUP = "resource.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
DRIVER = "gpu.nvidia.com"  # NVIDIA's driver, and the name of its DeviceClass for whole GPUs
GIB = 2**30
MIB = 2**20
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"  # KEP-5004's claims carry it


def _objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def slice_name(node: str, driver: str = DRIVER) -> str:
    return f"{node}-{driver}"


def gpu_devices(
    gpus: int, memory_gib: int, *, step: str = "1Mi", minimum: str = "1Mi", driver: str = DRIVER
) -> list[dict[str, Any]]:
    """``gpus`` devices as the driver's consumable shares (``memory`` mode) describe a GPU: a
    ``memory`` capacity of ``memory_gib`` GiB whose request policy defaults to all of it."""
    whole = f"{memory_gib}Gi"
    return [
        {
            "name": f"gpu-{index}",
            "allowMultipleAllocations": True,
            "attributes": {
                "type": {"string": "gpu"},
                "index": {"int": index},
                "minor": {"int": index},
                "uuid": {"string": f"GPU-{driver}-{index:08d}"},
                "productName": {"string": "NVIDIA Tesla T4"},
                "brand": {"string": "Nvidia"},
            },
            "capacity": {
                "memory": {
                    "value": whole,
                    "requestPolicy": {
                        "default": whole,
                        "validRange": {"min": minimum, "max": whole, "step": step},
                    },
                }
            },
        }
        for index in range(gpus)
    ]


def publish_gpus(
    api: client.ApiClient,
    node: str,
    *,
    gpus: int = 8,
    memory_gib: int = 16,
    driver: str = DRIVER,
    step: str = "1Mi",
    minimum: str = "1Mi",
) -> dict[str, Any]:
    """The node's ResourceSlice (one pool, named after the node, of one slice) with ``gpus``
    GPUs of ``memory_gib`` GiB each, as created (or replaced) through the API."""
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": gpu_devices(gpus, memory_gib, step=step, minimum=minimum, driver=driver),
        },
    }
    return _put(api, "resourceslices", body)


def unpublish(api: client.ApiClient, node: str, driver: str = DRIVER) -> None:
    """Delete the node's ResourceSlice, if there is one."""
    with contextlib.suppress(ApiException):
        _objects(api).delete_cluster_custom_object(
            GROUP, VERSION, "resourceslices", slice_name(node, driver)
        )


def device_class(
    api: client.ApiClient,
    name: str = DRIVER,
    driver: str = DRIVER,
    extended_resource_name: str | None = None,
) -> dict[str, Any]:
    """The DeviceClass of the driver's whole GPUs (its chart's selector), mapping
    ``extended_resource_name`` to it when given (KEP-5004); created or replaced."""
    spec: dict[str, Any] = {
        "selectors": [
            {
                "cel": {
                    "expression": (
                        f"device.driver == '{driver}' && "
                        f"device.attributes['{driver}'].type == 'gpu'"
                    )
                }
            }
        ]
    }
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    body = {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }
    return _put(api, "deviceclasses", body)


def delete_device_class(api: client.ApiClient, name: str) -> None:
    with contextlib.suppress(ApiException):
        _objects(api).delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", name)


def _put(api: client.ApiClient, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create a cluster-scoped object, or replace the one of that name."""
    objects = _objects(api)
    name = body["metadata"]["name"]
    try:
        found: dict[str, Any] = objects.create_cluster_custom_object(GROUP, VERSION, plural, body)
        return found
    except ApiException as error:
        if error.status != 409:
            raise
    stored = objects.get_cluster_custom_object(GROUP, VERSION, plural, name)
    body = {
        **body,
        "metadata": {**body["metadata"], "resourceVersion": stored["metadata"]["resourceVersion"]},
    }
    replaced: dict[str, Any] = objects.replace_cluster_custom_object(
        GROUP, VERSION, plural, name, body
    )
    return replaced


# -- claims --


def claim_spec(memory: str, device_class_name: str = DRIVER, count: int = 1) -> dict[str, Any]:
    """A ResourceClaim's spec asking ``count`` GPUs of the class, ``memory`` of each."""
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": device_class_name,
                        "count": count,
                        "capacity": {"requests": {"memory": memory}},
                    },
                }
            ]
        }
    }


def create_claim(
    api: client.ApiClient,
    namespace: str,
    name: str,
    memory: str,
    device_class_name: str = DRIVER,
    *,
    count: int = 1,
) -> dict[str, Any]:
    """A ResourceClaim asking ``count`` GPUs of the class, ``memory`` of each, as created."""
    body = {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": claim_spec(memory, device_class_name, count),
    }
    created: dict[str, Any] = _objects(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", body
    )
    return created


def create_template(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    """Create a ResourceClaimTemplate (``body``), unless one of its name is there."""
    try:
        _objects(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaimtemplates", body
        )
    except ApiException as error:
        if error.status != 409:
            raise


def claim(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = _objects(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaims", name
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


def list_claims(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    found = _objects(api).list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")
    return list(found["items"])


def list_templates(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    found = _objects(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaimtemplates"
    )
    return list(found["items"])


def claim_names(pod: dict[str, Any]) -> dict[str, str]:
    """The pod's claims as its status names them: ``{pod claim name: ResourceClaim name}``, the
    special claim of KEP-5004 as ``""``."""
    status = pod.get("status") or {}
    names = {
        entry["name"]: entry["resourceClaimName"]
        for entry in status.get("resourceClaimStatuses") or []
        if entry.get("resourceClaimName")
    }
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names[entry["name"]] = entry["resourceClaimName"]
    extended = status.get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):
        names[""] = extended["resourceClaimName"]
    return names


def claims_of(api: client.ApiClient, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's ResourceClaims as stored, by the name the pod gives each (claim_names)."""
    namespace = pod["metadata"]["namespace"]
    found = {}
    for key, name in claim_names(pod).items():
        stored = claim(api, namespace, name)
        if stored is not None:
            found[key] = stored
    return found


def results(claim_body: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's allocation results (``device``, ``pool``, ``driver``, ``consumedCapacity``,
    ``shareID``); none while it is unallocated."""
    allocation = (claim_body.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def quantity_bytes(value: str) -> int:
    """A quantity in bytes (``"4Gi"``, ``"4294967296"``, ``"512Mi"``)."""
    units = {"Ki": 2**10, "Mi": MIB, "Gi": GIB, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return int(value[: -len(suffix)]) * factor
    return int(value)


def consumed(claim_bodies: Iterable[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """Bytes of ``memory`` the claims hold on each device: ``{(pool, device): bytes}``."""
    found: dict[tuple[str, str], int] = {}
    for body in claim_bodies:
        for result in results(body):
            key = (result["pool"], result["device"])
            memory = (result.get("consumedCapacity") or {}).get("memory", "0")
            found[key] = found.get(key, 0) + quantity_bytes(memory)
    return found


def wait_allocated(
    api: client.ApiClient, namespace: str, pod_name: str, *, claims: int = 1, timeout: float = 30
) -> dict[str, dict[str, Any]]:
    """The pod's claims once ``claims`` of them are allocated."""
    core = client.CoreV1Api(api)
    found: dict[str, dict[str, Any]] = {}

    def allocated() -> bool:
        raw = core.read_namespaced_pod(pod_name, namespace, _preload_content=False)
        found.clear()
        found.update(claims_of(api, json.loads(raw.data)))
        return sum(1 for body in found.values() if results(body)) >= claims

    try:
        eventually(allocated, timeout=timeout)
    except AssertionError as error:
        raise AssertionError(f"{error}: pod {namespace}/{pod_name}, claims {found}") from None
    return found
