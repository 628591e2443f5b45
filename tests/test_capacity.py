"""GPU sizes from a node's capacity, and the snapshot in which the node watch shares them.

Pure: a Node's facts in, a GPU size out; the snapshot's status and facts
through JSON and back. The watch that reads Nodes is tests/test_nodes.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from webhook.decision.capacity import (
    Capacity,
    DeviceFacts,
    GpuBounds,
    GpuNode,
    NodeFacts,
    gpu_node,
    placement_key,
    uncounted,
)
from webhook.decision.nodesource import (
    DraFacts,
    NodeStatus,
    NoNodes,
    capacity_kept,
    decode_snapshot,
    encode_snapshot,
    facts_of,
    prepare,
)
from webhook.decision.policy import DEFAULT_POLICY, Policy, parse_policy
from webhook.decision.prepared import Kept, Prepared
from webhook.errors import SnapshotError


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        ({"aliyun.com/gpu-mem": "96", "aliyun.com/gpu-count": "4"}, (24, 4)),
        ({"aliyun.com/gpu-mem": "15", "aliyun.com/gpu-count": "2"}, (7, 2)),  # round down
        ({"aliyun.com/gpu-mem": "2", "aliyun.com/gpu-count": "2"}, (1, 2)),  # one unit each
        ({"aliyun.com/gpu-mem": "16"}, None),  # memory only: the extender makes no GPU
        ({"aliyun.com/gpu-mem": "16", "aliyun.com/gpu-count": "0"}, None),
        ({"aliyun.com/gpu-mem": "1", "aliyun.com/gpu-count": "2"}, None),  # under one unit
        ({"aliyun.com/gpu-mem": "0", "aliyun.com/gpu-count": "1"}, None),
        ({"aliyun.com/gpu-mem": "lots", "aliyun.com/gpu-count": "1"}, None),
        ({"aliyun.com/gpu-mem": "-8"}, None),
        ({"nvidia.com/gpu": "1", "cpu": "8"}, None),  # a GPU, but not a shared one
        ({}, None),
    ],
)
def test_gpu_node_from_capacity(capacity: dict[str, str], expected: tuple[int, int] | None) -> None:
    node = gpu_node(NodeFacts("n1", {}, capacity), DEFAULT_POLICY)
    assert (node and (node.gpu_memory, node.gpu_count)) == expected


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        ({"aliyun.com/gpu-mem": "16"}, (16, 1)),  # memory only: ACK's scheduler sees one card
        ({"aliyun.com/gpu-mem": "16", "aliyun.com/gpu-count": "0"}, (16, 1)),
        ({"aliyun.com/gpu-mem": "96", "aliyun.com/gpu-count": "4"}, (24, 4)),
    ],
)
def test_a_node_without_a_count_is_one_gpu_under_ack(
    capacity: dict[str, str], expected: tuple[int, int]
) -> None:
    node = gpu_node(NodeFacts("n1", {}, capacity), parse_policy({"scheduler": "ack"}))
    assert node
    assert (node.gpu_memory, node.gpu_count) == expected


def test_nodes_without_a_count_are_named_where_the_scheduler_sees_no_gpu() -> None:
    facts = [
        NodeFacts("counted", {}, {"aliyun.com/gpu-mem": "16", "aliyun.com/gpu-count": "2"}),
        NodeFacts("countless", {}, {"aliyun.com/gpu-mem": "16"}),
        NodeFacts("cpu-only", {}, {"cpu": "8"}),
    ]
    assert uncounted(facts, DEFAULT_POLICY) == ("countless",)
    assert uncounted(facts, parse_policy({"scheduler": "ack"})) == ()
    synced = NodeStatus(watching=True, tried=True, synced=True)
    assert prepare(facts, synced, DEFAULT_POLICY).uncounted == ("countless",)
    # Only nodes without a count: the policy's size stands in, and the note says why.
    alone = prepare(facts[1:], synced, DEFAULT_POLICY)
    assert alone.nodes is None
    assert alone.uncounted == ("countless",)
    assert "no node reports both aliyun.com/gpu-mem and aliyun.com/gpu-count" in alone.note


def test_without_nodes_a_policy_is_prepared_once_until_it_changes() -> None:
    source, other = NoNodes(), parse_policy({"gpuMemory": 24})
    first = source.prepared(DEFAULT_POLICY)
    assert source.prepared(DEFAULT_POLICY) is first
    assert source.prepared(other).policy is other
    assert source.prepared(other) is source.prepared(other)
    assert source.prepared(DEFAULT_POLICY) is not first  # made again, as the policy was


def test_gpu_node_follows_the_policy_resource_names() -> None:
    policy = parse_policy(
        {"resourceName": "example.com/vram", "multiGpu": {"resourceName": "example.com/cards"}}
    )
    facts = NodeFacts("n1", {}, {"example.com/vram": "80", "example.com/cards": "2"})
    assert gpu_node(facts, policy) == GpuNode("n1", 40, 2, {})
    assert gpu_node(facts, DEFAULT_POLICY) is None


# -- the snapshot: one watch per server, read by every worker --

FACTS = (
    NodeFacts(
        "a100-1", {"pool": "a100"}, {"aliyun.com/gpu-mem": "160", "aliyun.com/gpu-count": "2"}
    ),
    NodeFacts("cpu-1", {}, {}),
)


def test_a_snapshot_carries_the_status_and_facts_whole() -> None:
    status = NodeStatus(watching=True, tried=True, synced=True, connected=True, nodes=2)
    assert decode_snapshot(encode_snapshot(status, FACTS)) == (status, FACTS, DraFacts())


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[]", b'{"version": 1, "status": {}, "nodes": []}', b'{"version": 2}',
     b'{"version": 2, "status": {}, "nodes": [["a", {}]]}',
     b'{"version": 2, "status": {"tried": true}, "nodes": 3}'],
    ids=["empty", "truncated", "a list", "another version", "no status", "short node", "no list"],
)  # fmt: skip
def test_a_snapshot_this_code_did_not_write_is_a_snapshot_error(data: bytes) -> None:
    with pytest.raises(SnapshotError, match="node snapshot"):
        decode_snapshot(data)


DRA = DraFacts(
    devices=(
        DeviceFacts(
            "gpu.nvidia.com",
            "a100-1",
            "gpu-0",
            {"memory": Capacity(80 << 30, 1 << 20, 1 << 20)},
            True,
        ),
    ),
    classes=(("gpu-mem.example.com", "aliyun.com/gpu-mem"),),
)


def test_a_snapshot_carries_what_dra_publishes_whole() -> None:
    data = encode_snapshot(NodeStatus(synced=True), FACTS, DRA)
    assert decode_snapshot(data)[2] == DRA
    assert decode_snapshot(encode_snapshot(NodeStatus(), FACTS))[2] == DraFacts()
    with pytest.raises(SnapshotError, match="node snapshot"):
        decode_snapshot(
            b'{"version": 2, "status": {}, "nodes": [], "devices": [["a"]], "classes": []}'
        )
    with pytest.raises(SnapshotError, match="node snapshot"):
        decode_snapshot(b'{"version": 2, "status": {}, "nodes": []}')  # no DRA facts


def test_only_extended_resources_travel_in_a_snapshot() -> None:
    assert capacity_kept("aliyun.com/gpu-mem")
    assert not capacity_kept("cpu")
    assert not capacity_kept("hugepages-2Mi")


# -- what a review sees: the view of the nodes under one policy --


def test_a_node_as_the_api_serves_it_becomes_its_facts() -> None:
    node = {
        "metadata": {"name": "a100-1", "labels": {"pool": "a100", "gen": 7}},
        "status": {"capacity": {"cpu": "64", "aliyun.com/gpu-mem": 160, "nvidia.com/gpu": "2"}},
    }
    assert facts_of(node) == NodeFacts(
        "a100-1", {"pool": "a100", "gen": "7"}, {"aliyun.com/gpu-mem": "160", "nvidia.com/gpu": "2"}
    )
    assert facts_of({}) == NodeFacts("", {}, {})
    assert facts_of({"metadata": None, "status": {"capacity": None}}) == NodeFacts("", {}, {})


@pytest.mark.parametrize(
    ("status", "facts", "note"),
    [
        (
            NodeStatus(),
            FACTS,
            "GPU sizes come from the policy's gpuMemory (16 GiB): the cluster's node list is "
            "not available (not read yet)",
        ),
        (
            NodeStatus(tried=True, problem="forbidden to list nodes"),
            FACTS,
            "GPU sizes come from the policy's gpuMemory (16 GiB): the cluster's node list is "
            "not available (forbidden to list nodes)",
        ),
        (
            NodeStatus(synced=True),
            FACTS[1:],
            "GPU sizes come from the policy's gpuMemory (16 GiB): no node reports "
            "aliyun.com/gpu-mem",
        ),
        (NodeStatus(synced=True, problem="a watch was cut: still the last list"), FACTS, ""),
    ],
    ids=["not-read", "refused", "no-gpu-node", "synced"],
)
def test_a_view_says_why_the_policy_bounds_pods(
    status: NodeStatus, facts: tuple[NodeFacts, ...], note: str
) -> None:
    view = prepare(facts, status, DEFAULT_POLICY)
    assert view.note == note
    assert (view.nodes is None) == bool(note)
    if not note:
        assert view.nodes == (GpuNode("a100-1", 80, 2, {"pool": "a100"}),)


def test_a_prepared_policy_keeps_a_bounded_number_of_values() -> None:
    nodes = [GpuNode("a", 80, 2, {"pool": "a"}), GpuNode("b", 16, 1, {"pool": "b"})]
    prepared = Prepared(DEFAULT_POLICY, nodes)
    first = prepared.bounds({"nodeSelector": {"pool": "b"}})
    assert prepared.bounds({"nodeSelector": {"pool": "b"}}) is first
    for index in range(Prepared.MEMO_KEPT - 1):
        prepared.bounds({"nodeSelector": {"pool": str(index)}})
    # Full: the next new value starts the memo afresh.
    assert len(prepared._memo) == Prepared.MEMO_KEPT
    prepared.bounds({"nodeSelector": {"pool": "new"}})
    assert len(prepared._memo) == 1


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({}, ""),
        ({"nodeSelector": {}, "affinity": {}}, ""),
        ({"nodeSelector": {"b": "1", "a": "2"}}, '[{"a": "2", "b": "1"}, null]'),
        (
            {"affinity": {"podAntiAffinity": {"x": 1}}},
            "[null, null]",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gen"}]}]
                        }
                    }
                }
            },
            '[null, [{"matchExpressions": [{"key": "gen"}]}]]',
        ),
        ({"nodeSelector": {"pool": {1, 2}}}, '[{"pool": "{1, 2}"}, null]'),
    ],
    ids=["none", "empty", "selector-sorted", "other-affinity", "terms", "unserialisable"],
)
def test_pods_share_a_placement_when_selector_and_required_terms_agree(
    spec: dict[str, object], key: str
) -> None:
    assert placement_key(spec) == key


def test_a_snapshot_error_says_what_was_wrong() -> None:
    with pytest.raises(SnapshotError) as caught:
        decode_snapshot(b'{"version": 1, "status": {}, "nodes": []}')
    assert str(caught.value) == "node snapshot version 1, expected 2"
    with pytest.raises(SnapshotError) as caught:
        decode_snapshot(b"{")
    assert str(caught.value).startswith("node snapshot unreadable: JSONDecodeError: ")


def test_a_snapshot_keeps_what_it_knows_of_a_newer_status() -> None:
    data = (
        b'{"version": 2, "status": {"synced": true, "since": 5}, "nodes": [], "devices": [], '
        b'"classes": []}'
    )
    assert decode_snapshot(data) == (NodeStatus(synced=True), (), DraFacts())


def test_one_prepared_policy_is_kept_while_the_policy_and_the_node_list_are_the_same() -> None:
    kept, made = Kept(), list[Prepared]()
    other = dataclasses.replace(DEFAULT_POLICY, gpu_memory=24)
    nodes, again = ["a"], ["a"]  # equal, but not the same list

    def make(policy: Policy) -> Callable[[], Prepared]:
        def made_one() -> Prepared:
            made.append(Prepared(policy))
            return made[-1]

        return made_one

    first = kept.get(DEFAULT_POLICY, nodes, make(DEFAULT_POLICY))
    assert kept.get(DEFAULT_POLICY, nodes, make(DEFAULT_POLICY)) is first is kept.last
    assert kept.get(DEFAULT_POLICY, again, make(DEFAULT_POLICY)) is not first
    assert kept.get(other, again, make(other)).policy is other
    assert len(made) == 3


@pytest.mark.parametrize(
    ("nodes", "said"),
    [(None, "the largest GPU has 80 GiB (x)"), (1, "the largest GPU has 80 GiB (1 node of x)"),
     (2, "the largest GPU has 80 GiB (2 nodes of x)")],
)  # fmt: skip
def test_the_bounds_say_where_they_come_from(nodes: int | None, said: str) -> None:
    assert GpuBounds(80, 8, "x", nodes_with_largest=nodes).describe("GiB") == said
