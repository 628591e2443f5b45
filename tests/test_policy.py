"""Policy parsing: defaults, every key, and errors that name the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.helpers import rewrite_case
from webhook.decision.keys import document
from webhook.decision.policy import (
    DEFAULT_POLICY,
    dump_policy,
    folder,
    parse_policy,
    parse_policy_text,
)
from webhook.errors import PolicyError


def test_empty_document_is_the_defaults() -> None:
    assert parse_policy_text("") == DEFAULT_POLICY
    assert parse_policy_text("{}") == DEFAULT_POLICY


def test_defaults_match_the_documented_ones() -> None:
    doc = document(DEFAULT_POLICY)
    assert doc["scheduler"] == "gpushare-extender"
    assert doc["schedulerName"] == "default-scheduler"
    assert doc["resourceName"] == "aliyun.com/gpu-mem"
    assert doc["memoryUnit"] == "GiB"
    assert doc["gpuMemory"] == 16
    assert doc["shim"] == {
        "hostPath": "/usr/local/vgpu",
        "mountPath": "/usr/local/vgpu",
        "library": "libvgpu.so",
        "ldSoPreload": False,
        "initRegions": False,
        "initImage": "gpushare-webhook:0.1.0",
        "overrideFile": "/overrideEnv",
        "requireNodeLabel": False,
    }
    assert doc["security"] == {"rejectPrivileged": True, "rejectVisibleDevices": True}
    assert doc["env"]["memoryLimit"] == "CUDA_DEVICE_MEMORY_LIMIT"
    assert doc["excludeNamespaces"] == ["kube-system"]
    assert DEFAULT_POLICY.shim.preload == "/usr/local/vgpu/libvgpu.so"


def test_dump_round_trips() -> None:
    text = dump_policy(DEFAULT_POLICY)
    assert parse_policy_text(text) == DEFAULT_POLICY
    custom = parse_policy_text("memoryUnit: MiB\ngpuMemory: 24576\ncompute: {default: 25}\n")
    assert parse_policy_text(dump_policy(custom)) == custom


def test_every_key_is_read() -> None:
    policy = parse_policy_text(
        """
schedulerName: my-scheduler
resourceName: example.com/gpu-memory
memoryUnit: MiB
gpuMemory: 81920
shim: {hostPath: /opt/shim, mountPath: /shim, library: libcap.so}
env: {memoryLimit: MEM_LIMIT, smLimit: SM_LIMIT}
compute: {resourceName: example.com/gpu-core, default: proportional}
multiGpu: {resourceName: example.com/gpu-count, memory: perDevice, maxGpus: 4}
excludeNamespaces: [kube-system, monitoring]
"""
    )
    assert policy.scheduler_name == "my-scheduler"
    assert policy.memory_unit == "MiB"
    assert policy.mib_per_unit == 1
    assert policy.shim.preload == "/shim/libcap.so"
    assert policy.env.sm_limit == "SM_LIMIT"
    assert policy.compute.default == "proportional"
    assert policy.multi_gpu.max_gpus == 4
    assert policy.exclude_namespaces == ("kube-system", "monitoring")


ERRORS_FILE = Path(__file__).parent / "policy-errors.yaml"
ERRORS = yaml.safe_load(ERRORS_FILE.read_text())


@pytest.mark.parametrize("index", range(len(ERRORS)), ids=[e["policy"][:30] for e in ERRORS])
def test_errors_name_the_key(index: int) -> None:
    """Each wrong policy is one PolicyError naming the file, the key and what to write."""
    case = ERRORS[index]
    with pytest.raises(PolicyError) as caught:
        parse_policy_text(case["policy"], source="policy.yaml")
    if os.environ.get("GOLDEN_UPDATE") == "1":
        rewrite_case(ERRORS_FILE, index, "error", str(caught.value).removeprefix("policy.yaml: "))
        return
    assert str(caught.value) == f"policy.yaml: {case['error']}"


def test_parse_policy_none_is_defaults() -> None:
    assert parse_policy(None) is DEFAULT_POLICY


def test_the_policy_reference_is_policy_show() -> None:
    reference = (Path(__file__).parent.parent / "docs/policy.md").read_text()
    section = reference[reference.index("# Policy reference") :]
    block = section[section.index("```yaml\n") + len("```yaml\n") :]
    assert block[: block.index("```")] == dump_policy(DEFAULT_POLICY), (
        "docs/policy.md's reference differs from `gpushare-webhook policy show`: "
        "paste its output into the block"
    )


def test_every_key_is_documented_and_round_trips() -> None:
    text = dump_policy(DEFAULT_POLICY)
    for line in text.splitlines():
        assert "  # " in line, f"no documentation on {line!r}"
    assert parse_policy_text(text) == DEFAULT_POLICY


@pytest.mark.parametrize(
    ("text", "largest"),
    [
        ("memoryUnit: MiB\n", 16384),  # the default GPU, 16 GiB, counted in MiB
        ("memoryUnit: MiB\ngpuMemory: 24576\n", 24576),
        ("memoryUnit: GiB\n", 16),
        ("gpuMemory: 80\n", 80),
    ],
)
def test_the_default_gpu_is_16_gib_in_either_unit(text: str, largest: int) -> None:
    assert parse_policy_text(text).gpu_memory == largest


@pytest.mark.parametrize(
    ("text", "namespace", "expected"),
    [
        ("", "team-a", "enforce"),
        ("enforcement: warn", "team-a", "warn"),
        ("enforcement: warn", "", "warn"),
        ("namespaces: {team-a: {enforcement: warn}}", "team-a", "warn"),
        ("namespaces: {team-a: {enforcement: warn}}", "team-b", "enforce"),
        ("namespaces: {team-a: {enforcement: warn}}", "", "enforce"),
        ("enforcement: warn\nnamespaces: {team-a: {enforcement: enforce}}", "team-a", "enforce"),
        ("enforcement: warn\nnamespaces: {team-a: {}}", "team-a", "enforce"),
    ],
    ids=[
        "default",
        "cluster-warn",
        "cluster-warn-no-namespace",
        "namespace-warn",
        "other-namespace",
        "no-namespace",
        "namespace-enforces-under-cluster-warn",
        "namespace-listed-with-defaults",
    ],
)
def test_a_namespace_setting_wins_over_the_cluster_one(
    text: str, namespace: str, expected: str
) -> None:
    """A namespace listed takes its own settings, their defaults included."""
    assert parse_policy_text(text).enforcement_for(namespace) == expected


def test_namespace_settings_round_trip_in_name_order() -> None:
    text = "namespaces:\n  team-b: {enforcement: warn}\n  team-a: {enforcement: enforce}\n"
    policy = parse_policy_text(text)
    assert [name for name, _ in policy.namespaces.items] == ["team-a", "team-b"]
    assert parse_policy_text(dump_policy(policy)) == policy
    assert document(policy)["namespaces"] == {
        "team-a": {"enforcement": "enforce"},
        "team-b": {"enforcement": "warn"},
    }


@pytest.mark.parametrize(
    "text",
    [
        "gpuMemory: 1",
        "gpuMemory: 1099511627776",
        "multiGpu: {maxGpus: 1}",
        "multiGpu: {maxGpus: 1024}",
        "compute: {default: 1}",
        "compute: {default: 100}",
        "compute: {default: none}",
        "shim: {overrideFile: ''}",
        "shim: {hostPath: /v, mountPath: /v, library: l}",
    ],
)
def test_each_limit_of_a_key_is_accepted_at_its_edge(text: str) -> None:
    policy = parse_policy_text(text)
    assert parse_policy_text(dump_policy(policy)) == policy


def test_policy_show_prints_every_key_on_one_line_and_namespaces_by_name() -> None:
    many = [f"team-{i:02d}" for i in range(30)]
    policy = parse_policy(
        {"excludeNamespaces": many, "namespaces": {"team-b": {"enforcement": "warn"}}}
    )
    shown = dump_policy(policy).splitlines()
    (excluded,) = [line for line in shown if line.startswith("excludeNamespaces:")]
    assert excluded.startswith(f"excludeNamespaces: [{', '.join(many)}]  # ")
    start = shown.index(
        "namespaces:                         # per namespace: NAME: {enforcement: warn}; "
        "set only here, never by labels"
    )
    assert shown[start + 1 :] == [
        "  team-b:",
        "    enforcement: warn               # enforce (refuse) or warn (admit, with a warning "
        "per refusal)",
    ]


@pytest.mark.parametrize(
    ("path", "folder_of"),
    [("/a/b", "/a/b/"), ("/a/b//", "/a/b/"), ("/opt/X", "/opt/X/"), ("/", "/")],
)
def test_a_folder_has_one_trailing_slash(path: str, folder_of: str) -> None:
    assert folder(path) == folder_of
