"""``scheduler: dra``: claims, templates, published GPUs and the sizes read from them.

The answers a pod gets are pinned by tests/rules/dra.yaml; these tables pin
the parts on their own: the names (the guard and ``report`` read them
back), the template the cluster side makes from a name, the ops on every
shape a pod's resources and claims can have, the request policy's grid,
and what a ResourceSlice and a DeviceClass come to.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import apply
from webhook.decision.asks import ContainerAsk
from webhook.decision.capacity import Capacity, DeviceFacts, dra_devices, dra_nodes
from webhook.decision.claims import (
    DRA_LABEL,
    check_grid,
    claim_name,
    claim_ops,
    claimed_asks,
    held_bytes,
    is_claimed,
    on_grid,
    template,
    template_name,
    template_shape,
)
from webhook.decision.model import gpu_pod, stored_gpu_pod
from webhook.decision.nodesource import (
    DraFacts,
    NodeFacts,
    NodeStatus,
    class_of,
    devices_of,
    prepare,
)
from webhook.decision.policy import parse_policy
from webhook.decision.rules import Problems
from webhook.reasons import Reason

DRA = parse_policy({"scheduler": "dra"})
HAMI = parse_policy(
    {
        "scheduler": "dra",
        "memoryUnit": "MiB",
        "dra": {
            "deviceClassName": "hami-core-gpu.project-hami.io",
            "driver": "hami-core-gpu.project-hami.io",
            "computeCapacity": "cores",
        },
    }
)
GIB, MIB = 2**30, 2**20


def ask(name: str = "main", memory: int = 4, gpus: int = 1, **more: Any) -> ContainerAsk:
    kind, position = more.pop("kind", "containers"), more.pop("position", 0)
    return ContainerAsk(kind, position, name, memory, gpus, more.get("compute"))


@pytest.mark.parametrize(
    ("name", "kind", "position", "claim"),
    [
        ("main", "containers", 0, "gpushare-main"),
        ("a" * 54, "containers", 3, "gpushare-" + "a" * 54),
        ("a" * 55, "containers", 3, "gpushare-c3"),
        ("b" * 63, "initContainers", 1, "gpushare-i1"),
    ],
)
def test_a_claim_is_named_by_its_container_while_the_name_fits_a_label(
    name: str, kind: str, position: int, claim: str
) -> None:
    assert claim_name(ask(name, kind=kind, position=position)) == claim


@pytest.mark.parametrize(
    ("policy", "asked", "name", "shape"),
    [
        (DRA, ask(memory=4), "gpushare-4096mi.gpu.nvidia.com", (4096, 1, None, "gpu.nvidia.com")),
        (
            DRA,
            ask(memory=8, gpus=2),
            "gpushare-8192mi-x2.gpu.nvidia.com",
            (8192, 2, None, "gpu.nvidia.com"),
        ),
        (
            DRA,
            ask(memory=8, compute=30),
            "gpushare-8192mi.gpu.nvidia.com",
            (8192, 1, None, "gpu.nvidia.com"),
        ),
        (
            HAMI,
            ask(memory=1500, compute=30),
            "gpushare-1500mi-c30.hami-core-gpu.project-hami.io",
            (1500, 1, 30, "hami-core-gpu.project-hami.io"),
        ),
        (
            HAMI,
            ask(memory=1500, gpus=3),
            "gpushare-1500mi-x3-c0.hami-core-gpu.project-hami.io",
            (1500, 3, 0, "hami-core-gpu.project-hami.io"),
        ),
    ],
)
def test_a_template_is_named_by_all_it_asks_and_the_name_reads_back(
    policy: Any, asked: ContainerAsk, name: str, shape: tuple[int, int, int | None, str]
) -> None:
    assert template_name(asked, policy) == name
    assert template_shape(name) == shape


@pytest.mark.parametrize(
    "name",
    [
        "rdma",
        "gpushare-4096mi",
        "gpushare-4096.gpu.nvidia.com",
        "gpushare-x-4096mi.a",
        "gpushare-mi.a",
        "my-gpushare-4096mi.a",
        "gpushare-4096mi-c.a",
        "gpushare-4096mi-x2-x3.a",
    ],
)
def test_a_name_the_webhook_does_not_give_is_no_template_of_its(name: str) -> None:
    assert template_shape(name) is None
    assert template(name, DRA) is None


def test_the_template_asks_its_bytes_and_share_of_one_class_per_device() -> None:
    made = template("gpushare-1500mi-x2-c30.hami-core-gpu.project-hami.io", HAMI)
    assert made == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": "gpushare-1500mi-x2-c30.hami-core-gpu.project-hami.io",
            "labels": {"app.kubernetes.io/managed-by": "gpushare-webhook"},
        },
        "spec": {
            "metadata": {"labels": {"app.kubernetes.io/managed-by": "gpushare-webhook"}},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "hami-core-gpu.project-hami.io",
                                "allocationMode": "ExactCount",
                                "count": 2,
                                "capacity": {"requests": {"memory": "1500Mi", "cores": "30"}},
                            },
                        }
                    ]
                }
            },
        },
    }
    # A driver without a compute capacity: the share in the name is not asked of it.
    plain = template("gpushare-4096mi-c30.gpu.nvidia.com", DRA)
    assert plain is not None
    request = plain["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["capacity"] == {"requests": {"memory": "4096Mi"}}
    assert request["count"] == 1


def _pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": spec.pop("metadata", {"name": "p"}),
        "spec": {"containers": list(containers), **spec},
    }


GPU = {"aliyun.com/gpu-mem": "4"}


@pytest.mark.parametrize(
    ("pod", "expected_resources"),
    [
        (
            _pod({"name": "main", "resources": {"limits": dict(GPU)}}),
            {"limits": {}, "claims": [{"name": "gpushare-main"}]},
        ),
        (
            _pod(
                {
                    "name": "main",
                    "resources": {"limits": {**GPU, "cpu": "1"}, "requests": {**GPU, "cpu": "1"}},
                }
            ),
            {
                "limits": {"cpu": "1"},
                "requests": {"cpu": "1"},
                "claims": [{"name": "gpushare-main"}],
            },
        ),
        (
            _pod({"name": "main", "resources": {"limits": dict(GPU), "claims": [{"name": "nic"}]}}),
            {"limits": {}, "claims": [{"name": "nic"}, {"name": "gpushare-main"}]},
        ),
        (
            _pod(
                {
                    "name": "main",
                    "resources": {
                        "limits": {
                            **GPU,
                            "aliyun.com/gpu-count": "1",
                            "aliyun.com/gpu-core.percentage": "20",
                        }
                    },
                }
            ),
            {"limits": {}, "claims": [{"name": "gpushare-main"}]},
        ),
    ],
)
def test_a_container_trades_the_resources_its_claim_stands_in_for_for_the_claim(
    pod: dict[str, Any], expected_resources: dict[str, Any]
) -> None:
    ops = claim_ops(pod["spec"], pod["metadata"], [ask()], DRA)
    done = apply(pod, [op.as_json() for op in ops])
    assert done["spec"]["containers"][0]["resources"] == expected_resources
    assert done["metadata"]["labels"] == {DRA_LABEL: "true"}
    assert claim_ops(done["spec"], done["metadata"], [ask()], DRA) == []


def test_a_container_without_resources_gets_its_claim_and_a_pods_claims_are_kept() -> None:
    mine = {"name": "gpushare-main", "resourceClaimTemplateName": "gpushare-4096mi.gpu.nvidia.com"}
    nic = {"name": "nic", "resourceClaimTemplateName": "rdma"}
    stale = {"name": "gpushare-main", "resourceClaimTemplateName": "gpushare-1mi.gpu.nvidia.com"}
    for claims, expected in (
        ([nic], [nic, mine]),
        ([stale, nic], [mine, nic]),
        ([nic, mine], [nic, mine]),
        ([], [mine]),
    ):
        pod = _pod({"name": "main"}, resourceClaims=list(claims), metadata={"labels": {"a": "b"}})
        done = apply(
            pod, [op.as_json() for op in claim_ops(pod["spec"], pod["metadata"], [ask()], DRA)]
        )
        assert done["spec"]["resourceClaims"] == expected
        assert done["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpushare-main"}]}
        assert done["metadata"]["labels"] == {"a": "b", DRA_LABEL: "true"}
    bare = {"spec": {"containers": [{"name": "main"}]}, "metadata": {}}
    done = apply(bare, [op.as_json() for op in claim_ops(bare["spec"], {}, [ask()], DRA)])
    assert done["metadata"] == {"labels": {DRA_LABEL: "true"}}
    # No metadata at all (only a hand-made review has none): it is made whole.
    none = {"spec": {"containers": [{"name": "main"}], "resourceClaims": {"not": "a list"}}}
    done = apply(none, [op.as_json() for op in claim_ops(none["spec"], {}, [ask()], DRA)])
    assert done["metadata"] == {"labels": {DRA_LABEL: "true"}}
    assert done["spec"]["resourceClaims"] == [mine]
    wrong = {"spec": {"containers": [{"name": "main"}]}, "metadata": {"labels": {DRA_LABEL: "no"}}}
    done = apply(
        wrong, [op.as_json() for op in claim_ops(wrong["spec"], wrong["metadata"], [ask()], DRA)]
    )
    assert done["metadata"]["labels"] == {DRA_LABEL: "true"}


@pytest.mark.parametrize(
    ("labels", "claimed"),
    [
        ({DRA_LABEL: "true"}, True),
        ({DRA_LABEL: "false"}, False),
        ({}, False),
        (None, False),
        ("x", False),
    ],
)
def test_a_pod_is_claimed_by_its_label(labels: Any, claimed: bool) -> None:
    assert is_claimed({"metadata": {"labels": labels}}) is claimed
    assert is_claimed({"metadata": "x"}) is False


def test_a_stored_pod_is_read_back_from_its_claims_not_its_annotations() -> None:
    pod = {
        "metadata": {"labels": {DRA_LABEL: "true"}},
        "spec": {
            "initContainers": [
                {"name": "warm", "resources": {"claims": [{"name": "gpushare-warm"}]}}
            ],
            "containers": [
                {
                    "name": "main",
                    "resources": {"claims": [{"name": "nic"}, {"name": "gpushare-main"}]},
                },
                {"name": "side", "resources": {"claims": [{"name": "other"}]}},
                "not a container",
                {"name": "bare"},
            ],
            "resourceClaims": [
                {
                    "name": "gpushare-warm",
                    "resourceClaimTemplateName": "gpushare-2048mi-x2.gpu.nvidia.com",
                },
                {
                    "name": "gpushare-main",
                    "resourceClaimTemplateName": "gpushare-8192mi-x2-c30.gpu.nvidia.com",
                },
                {"name": "nic", "resourceClaimTemplateName": "gpushare-1024mi.gpu.nvidia.com"},
                {"name": "other", "resourceClaimTemplateName": "rdma"},
                "not a claim",
            ],
        },
    }
    asks = claimed_asks(pod["spec"], DRA)
    assert asks == [
        ContainerAsk("initContainers", 0, "warm", 2, 2, None, False),
        ContainerAsk("containers", 0, "main", 8, 2, 30, True),
    ]
    model = stored_gpu_pod(pod, DRA)
    assert model == gpu_pod(asks, DRA)
    # Every claim is held for the pod's life, each on a GPU of its own choosing.
    assert (model.held_per_gpu, model.held_per_pod, model.gpus) == (8, 20, 2)
    # Not claimed (no label): read as admission reads it, and it asks nothing.
    assert stored_gpu_pod({"spec": pod["spec"]}, DRA).asks == ()


def test_a_claimed_containers_ask_is_its_templates_whatever_else_the_pod_holds() -> None:
    def claim(name: str, template: str) -> dict[str, str]:
        return {"name": name, "resourceClaimTemplateName": template}

    spec = {
        "containers": [
            "not a container",
            {"resources": {"claims": ["not a reference", {"name": "gpushare-c1"}]}},
            {"name": "none", "resources": {"claims": [{"name": "gpushare-none"}]}},
            {"name": "one", "resources": {"claims": [{"name": "gpushare-one"}]}},
            {"name": "odd", "resources": {"claims": [{"name": "gpushare-odd"}]}},
        ],
        "resourceClaims": [
            claim("gpushare-c1", "gpushare-4096mi.gpu.nvidia.com"),
            claim("gpushare-none", "gpushare-1024mi-c0.gpu.nvidia.com"),
            claim("gpushare-one", "gpushare-1024mi-c1.gpu.nvidia.com"),
            # Made under a policy in MiB, read under one in GiB: all it holds counts.
            claim("gpushare-odd", "gpushare-1500mi.gpu.nvidia.com"),
            {"name": "gpushare-x"},
        ],
    }
    assert claimed_asks(spec, DRA) == [
        ContainerAsk("containers", 1, "", 4, 1, None, False),
        ContainerAsk("containers", 2, "none", 1, 1, None, False),
        ContainerAsk("containers", 3, "one", 1, 1, 1, True),
        ContainerAsk("containers", 4, "odd", 2, 1, None, False),
    ]


@pytest.mark.parametrize(
    ("request_bytes", "minimum", "step", "held"),
    [
        (4 * GIB, MIB, MIB, True),
        (4 * GIB, 0, MIB, True),
        (4 * GIB, 0, 0, True),
        (1500 * MIB, GIB, GIB, False),
        (2 * GIB, GIB, GIB, True),
        (GIB, GIB, GIB, True),
        (GIB - MIB, GIB, GIB, False),
        (3 * MIB, MIB, 2 * MIB, True),
        (4 * MIB, MIB, 2 * MIB, False),
    ],
)
def test_a_request_is_held_exactly_only_on_its_devices_grid(
    request_bytes: int, minimum: int, step: int, held: bool
) -> None:
    assert on_grid(request_bytes, minimum, step) is held


@pytest.mark.parametrize(
    ("request_bytes", "minimum", "step", "held"),
    [
        (512 * MIB, GIB, MIB, GIB),
        (512 * MIB, GIB, GIB, GIB),
        (512 * MIB, GIB, 0, GIB),
        (GIB, GIB, GIB, GIB),
        (GIB, GIB, 0, GIB),
        (1500 * MIB, GIB, GIB, 2 * GIB),
        (1500 * MIB, GIB, 0, 1500 * MIB),
        (4 * GIB, 0, 0, 4 * GIB),
        (3 * MIB, MIB, 2 * MIB, 3 * MIB),
        (4 * MIB, MIB, 2 * MIB, 5 * MIB),
    ],
)
def test_a_request_is_held_rounded_up_onto_its_devices_grid(
    request_bytes: int, minimum: int, step: int, held: int
) -> None:
    assert held_bytes(request_bytes, minimum, step) == held


def test_an_ask_off_every_grid_is_named_with_what_its_claim_would_hold() -> None:
    policy = parse_policy({"scheduler": "dra", "memoryUnit": "MiB"})
    found: Problems = []
    asks = [ask("a", 1500), ask("b", 2048), ask("c", 512)]
    check_grid(asks, [(GIB, GIB)], policy, found)
    assert [(p.reason, p.message) for p in found] == [
        (
            Reason.OFF_GRID,
            "container 'a' asks 1500 MiB of aliyun.com/gpu-mem, but the GPUs driver gpu.nvidia.com "
            "publishes take memory in steps of 1024 MiB from 1024 MiB, so its claim would hold "
            "2048 MiB, more than its limit; ask an amount on that grid",
        ),
        (Reason.OFF_GRID, found[1].message),
    ]
    assert "would hold 1024 MiB" in found[1].message
    under: Problems = []
    check_grid([ask("c", 512)], [(GIB, MIB)], policy, under)
    assert "would hold 1024 MiB" in under[0].message
    again: Problems = []
    check_grid(asks, [(GIB, GIB), (MIB, MIB)], policy, again)  # one device holds each exactly
    check_grid(asks, [], policy, again)  # nothing published: nothing to say
    assert again == []


def _slice(node: str, driver: str = "gpu.nvidia.com", *devices: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"driver": driver, "nodeName": node, "devices": list(devices)}}


def _device(name: str, memory: str, **policy: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"value": memory}
    if policy:
        entry["requestPolicy"] = {"validRange": policy}
    return {"name": name, "allowMultipleAllocations": True, "capacity": {"memory": entry}}


def test_a_resource_slice_is_read_as_go_reads_its_quantities() -> None:
    read = devices_of(
        _slice(
            "a",
            "gpu.nvidia.com",
            _device("gpu-0", "16Gi", min="1Mi", step="1Mi"),
            {"name": "gpu-1", "capacity": {"cores": "x", "memory": {"value": "15.5Gi"}}},
            "not a device",
            {"capacity": {"memory": {"value": "nonsense"}}},
        )
    )
    assert read == [
        DeviceFacts("gpu.nvidia.com", "a", "gpu-0", {"memory": Capacity(16 * GIB, MIB, MIB)}, True),
        DeviceFacts("gpu.nvidia.com", "a", "gpu-1", {"memory": Capacity(int(15.5 * GIB))}, False),
        DeviceFacts("gpu.nvidia.com", "a", "", {"memory": Capacity(0)}, False),
    ]
    assert devices_of({}) == []
    assert devices_of({"spec": {"driver": "d"}}) == []
    # A slice of devices on no one node (allNodes, a nodeSelector) names none: no node counts it.
    (anywhere,) = devices_of({"spec": {"allNodes": True, "devices": [_device("g", "1Gi")]}})
    assert (anywhere.driver, anywhere.node) == ("", "")


@pytest.mark.parametrize(
    ("device_class", "mapped"),
    [
        (
            {"metadata": {"name": "m"}, "spec": {"extendedResourceName": "aliyun.com/gpu-mem"}},
            ("m", "aliyun.com/gpu-mem"),
        ),
        ({"metadata": {"name": "m"}, "spec": {}}, None),
        ({"metadata": {"name": "m"}}, None),
        ({"spec": {"extendedResourceName": "x/y"}}, ("", "x/y")),
    ],
)
def test_a_device_class_maps_a_resource_only_where_it_names_one(
    device_class: dict[str, Any], mapped: tuple[str, str] | None
) -> None:
    assert class_of(device_class) == mapped


DEVICES = (
    DeviceFacts("gpu.nvidia.com", "a", "gpu-0", {"memory": Capacity(24 * GIB, MIB, MIB)}, True),
    DeviceFacts("gpu.nvidia.com", "a", "gpu-1", {"memory": Capacity(16 * GIB, MIB, MIB)}, True),
    DeviceFacts("gpu.nvidia.com", "b", "gpu-0", {"memory": Capacity(GIB - 1, 0, 2 * MIB)}, True),
    DeviceFacts("gpu.nvidia.com", "", "gpu-x", {"memory": Capacity(80 * GIB)}, True),
    DeviceFacts("other.example.com", "c", "big", {"memory": Capacity(80 * GIB)}, True),
    DeviceFacts("gpu.nvidia.com", "d", "nic", {"bandwidth": Capacity(100)}, False),
    DeviceFacts("gpu.nvidia.com", "e", "gpu-0", {"memory": Capacity(GIB, MIB, MIB)}, True),
)
NODES = (NodeFacts("a", {"pool": "big"}, {}), NodeFacts("b", {}, {}))


def test_the_published_gpus_of_the_policys_driver_on_a_node_are_its_gpu_nodes() -> None:
    assert [d.node for d in dra_devices(DEVICES, DRA)] == ["a", "a", "b", "e"]
    nodes = dra_nodes(DEVICES, NODES, DRA)
    # Node b's device holds under one GiB: no GPU a GiB pod can use. Node e's holds
    # exactly one, and e has no Node object here: it has no labels.
    assert [(n.name, n.gpu_memory, n.gpu_count, dict(n.labels)) for n in nodes] == [
        ("a", 24, 2, {"pool": "big"}),
        ("e", 1, 1, {}),
    ]
    in_mib = parse_policy({"scheduler": "dra", "memoryUnit": "MiB"})
    assert [(n.name, n.gpu_memory) for n in dra_nodes(DEVICES, (), in_mib)] == [
        ("a", 24576),
        ("b", 1023),
        ("e", 1024),
    ]


def test_under_dra_a_review_is_sized_by_the_published_gpus_and_told_why_when_none() -> None:
    synced = NodeStatus(synced=True)
    classes = (("m", "aliyun.com/gpu-mem"), ("n", "nvidia.com/gpu"), ("k", "aliyun.com/gpu-count"))
    prepared = prepare(NODES, synced, DRA, DraFacts(DEVICES, classes))
    assert prepared.nodes is not None
    assert [n.name for n in prepared.nodes] == ["a", "e"]
    assert prepared.grids == ((0, 2 * MIB), (MIB, MIB))
    assert prepared.mapped == (("k", "aliyun.com/gpu-count"), ("m", "aliyun.com/gpu-mem"))
    assert prepared.note == ""
    none = prepare(NODES, synced, DRA, DraFacts((), classes))
    assert none.nodes is None
    assert none.note == (
        "GPU sizes come from the policy's gpuMemory (16 GiB): no ResourceSlice of driver "
        "gpu.nvidia.com publishes a GPU with memory"
    )
    assert none.mapped == prepared.mapped
    waiting = prepare(NODES, NodeStatus(problem="forbidden"), DRA, DraFacts(DEVICES))
    assert waiting.note == (
        "GPU sizes come from the policy's gpuMemory (16 GiB): the cluster's ResourceSlices are "
        "not available (forbidden)"
    )
    assert prepare((), NodeStatus(), DRA).note.endswith("are not available (not read yet)")
    # Under the extender the classes still count, the devices do not.
    extender = prepare((), synced, parse_policy({}), DraFacts(DEVICES, classes))
    assert (extender.mapped, extender.grids, extender.nodes) == (prepared.mapped, (), None)
