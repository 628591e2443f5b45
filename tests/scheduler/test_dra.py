"""``scheduler: dra`` against the real kube-scheduler: GPUs published as ResourceSlices (as
NVIDIA's driver publishes them with consumable shares, tests/controlplane/dra.py) on fake nodes
KWOK plays, claims allocated by kube-scheduler's DynamicResources plugin with consumable capacity,
and made and deleted by kube-controller-manager's resourceclaim controller.

No webhook in the first test: explicit claims show the tier's DRA works on its own. The rest take
pods through the whole pipeline with the webhook serving a policy of ``scheduler: dra``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.controlplane import dra
from tests.helpers import container, pod
from tests.scheduler.helpers import create_pod, wait_running, wait_unschedulable

OPTED_OUT = {"gpushare-webhook.io/injection": "disabled"}  # the webhook configuration skips it
GIB = dra.GIB


def claimed_pod(name: str, claim: str, node: str) -> dict[str, Any]:
    """A pod of one container using ResourceClaim ``claim``, kept to ``node``."""
    main = container("main", resources={"claims": [{"name": "gpu"}]})
    return pod(
        main,
        name=name,
        namespace=None,
        resourceClaims=[{"name": "gpu", "resourceClaimName": claim}],
        nodeSelector={"kubernetes.io/hostname": node},
    )


@pytest.mark.parametrize("configuration", ["install-guide"])
def test_explicit_claims_pack_one_gpu_by_bytes_and_one_too_large_waits(
    scheduler: Any,
    api: client.ApiClient,
    namespace: str,
    gpu_node: Callable[..., dict[str, Any]],
) -> None:
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": OPTED_OUT}})
    node = f"dra-one-{namespace}"
    gpu_node(node, gpus=0)
    dra.device_class(api)
    dra.publish_gpus(api, node, gpus=1, memory_gib=16)
    try:
        for index in range(4):
            dra.create_claim(api, namespace, f"quarter-{index}", "4Gi")
            create_pod(api, namespace, claimed_pod(f"quarter-{index}", f"quarter-{index}", node))
        dra.create_claim(api, namespace, "too-large", "20Gi")
        create_pod(api, namespace, claimed_pod("too-large", "too-large", node))

        claims = {}
        for index in range(4):
            assert wait_running(api, namespace, f"quarter-{index}")["spec"]["nodeName"] == node
            stored = dra.claim(api, namespace, f"quarter-{index}")
            assert stored is not None
            (result,) = dra.results(stored)
            assert (result["pool"], result["device"]) == (node, "gpu-0")
            assert result["consumedCapacity"] == {"memory": "4Gi"}
            assert result.get("shareID")
            claims[index] = stored
        assert dra.consumed(claims.values()) == {(node, "gpu-0"): 16 * GIB}

        message = wait_unschedulable(api, namespace, "too-large")
        assert "cannot allocate all claims" in message, message
        too_large = dra.claim(api, namespace, "too-large")
        assert too_large is not None
        assert not dra.results(too_large)
    finally:
        dra.unpublish(api, node)
