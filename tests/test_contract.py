"""The shim's contract: whatever env and envFrom say, the shim sees the webhook's values.

HAMi-core reads each device's limit before the plain one and more
variables besides (``webhook.decision.contract``); a container's
environment also comes from ConfigMaps and Secrets through ``envFrom``,
which the webhook never sees. The property below resolves a container's
environment the way the kubelet does and checks every pinned variable.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import GPU, apply, container, examples, pod
from webhook.decision import contract
from webhook.decision.layout import ACCOUNTING_SIZE, layout_of
from webhook.decision.plan import plan
from webhook.decision.policy import DEFAULT_POLICY, parse_policy_text
from webhook.decision.prepared import Prepared
from webhook.decision.quantities import parse_quantity

ROOT = Path(__file__).parent.parent
COMPUTE = "aliyun.com/gpu-core.percentage"
SHIM = DEFAULT_POLICY.shim.preload
# ACK's scheduler: the only one that places a pod on several GPUs, so the
# per-device variables of the multi-GPU label are pinned too.
POLICY = parse_policy_text("scheduler: ack\ncompute: {default: none}\n")

# Names a user might set, to loosen a limit or by accident: every pinned one,
# per-device variants past any GPU count, and names of no concern.
LOOSENING = [
    *(f"CUDA_DEVICE_MEMORY_LIMIT{suffix}" for suffix in ["", "_0", "_1", "_2", "_3", "_7", "_15"]),
    *(f"CUDA_DEVICE_SM_LIMIT{suffix}" for suffix in ["", "_0", "_1", "_3"]),
    contract.REGION,
    contract.REDIRECT,
    contract.UTILIZATION_POLICY,
    "LD_PRELOAD",
    "MODEL",
]
VALUES = st.sampled_from(["100g", "0", "", "disable", "/usr/lib/libcuda.so.1", "/data/x.cache"])


def resolve(c: dict[str, Any], sources: dict[str, dict[str, str]]) -> dict[str, str]:
    """A container's environment as the kubelet builds it.

    envFrom first, in order (a later source wins a shared key; ``prefix``
    is put before each key), then env in order (a later entry wins, and any
    entry wins over envFrom). valueFrom stands for a value nobody can know.
    """
    env: dict[str, str] = {}
    for source in c.get("envFrom") or []:
        ref = source.get("configMapRef") or source.get("secretRef")
        for key, value in sources[ref["name"]].items():
            env[source.get("prefix", "") + key] = value
    for entry in c.get("env") or []:
        env[entry["name"]] = entry.get("value", "(valueFrom)")
    return env


@st.composite
def configured(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """A GPU pod whose containers set loosening variables through env and envFrom."""
    sources: dict[str, dict[str, str]] = {}
    gpus = draw(st.integers(1, 4))
    kinds: dict[str, list[dict[str, Any]]] = {"containers": [], "initContainers": []}
    for kind, listed in kinds.items():
        for index in range(draw(st.integers(1 if kind == "containers" else 0, 2))):
            limits = {GPU: str(gpus * draw(st.integers(1, 4)))}  # an even split
            if draw(st.booleans()):
                limits[COMPUTE] = str(draw(st.integers(1, 40)))
            env = [
                {"name": name, "value": draw(VALUES)}
                for name in draw(st.lists(st.sampled_from(LOOSENING), max_size=6))
            ]
            env_from = []
            for _ in range(draw(st.integers(0, 2))):
                prefix = draw(st.sampled_from(["", "CUDA_", "CUDA_DEVICE_"]))
                names = draw(st.lists(st.sampled_from(LOOSENING), max_size=6))
                data = {
                    name.removeprefix(prefix): draw(VALUES)
                    for name in names
                    if name.startswith(prefix) and name != prefix
                }
                ref = f"cm{len(sources)}"
                sources[ref] = data
                which = draw(st.sampled_from(["configMapRef", "secretRef"]))
                env_from.append({which: {"name": ref}, **({"prefix": prefix} if prefix else {})})
            c = container(f"{kind[0]}{index}", gpu=None, resources={"limits": limits})
            if env:
                c["env"] = env
            if env_from:
                c["envFrom"] = env_from
            listed.append(c)
    obj = pod(*kinds["containers"], init=kinds["initContainers"] or None)
    obj["metadata"]["labels"] = {"aliyun.com/gpu-count": str(gpus)}
    return obj, sources


@settings(max_examples=examples(300), deadline=None)
@given(configured())
def test_every_pinned_variable_holds_whatever_env_and_env_from_say(
    case: tuple[dict[str, Any], dict[str, dict[str, str]]],
) -> None:
    obj, sources = case
    decision = plan(obj, Prepared(POLICY))
    if not decision.allowed:
        # Only the fit may refuse these pods; never a variable the user set.
        assert decision.reason in {"exceeds-gpu", "exceeds-compute"}, decision.message
        return
    out = apply(obj, list(decision.patch))
    gpus = int(obj["metadata"]["labels"]["aliyun.com/gpu-count"])
    for kind in ("containers", "initContainers"):
        for c in out["spec"].get(kind) or []:
            seen = resolve(c, sources)
            limits = c["resources"]["limits"]
            mib = f"{int(limits[GPU]) * 1024 // gpus}m"
            pinned = {"CUDA_DEVICE_MEMORY_LIMIT": mib}
            pinned |= {f"CUDA_DEVICE_MEMORY_LIMIT_{i}": mib for i in range(gpus)}
            if COMPUTE in limits:
                share = limits[COMPUTE]
                pinned |= {"CUDA_DEVICE_SM_LIMIT": share, contract.UTILIZATION_POLICY: "default"}
                pinned |= {f"CUDA_DEVICE_SM_LIMIT_{i}": share for i in range(gpus)}
            pinned[contract.REGION] = contract.region_path(c["name"])
            pinned[contract.REDIRECT] = SHIM
            assert {name: seen.get(name) for name in pinned} == pinned, c["name"]
            assert seen["LD_PRELOAD"].split(":")[0] == SHIM
            # Per-device variables past the container's GPUs can only come from envFrom,
            # for devices it cannot see; none is left in env.
            names = [e["name"] for e in c["env"]]
            assert not [
                n
                for n in names
                if re.fullmatch(r"CUDA_DEVICE_\w+_LIMIT_\d+", n)
                and int(n.rsplit("_", 1)[1]) >= gpus
            ]


def test_a_mount_over_the_override_file_is_refused() -> None:
    mounts = [{"name": "cfg", "mountPath": "/overrideEnv", "subPath": "env"}]
    decision = plan(pod(container(gpu="4", volumeMounts=mounts)), Prepared(DEFAULT_POLICY))
    assert not decision.allowed
    assert decision.reason == "shim-mount"
    assert "/overrideEnv" in decision.message
    assert "an empty file" in decision.message


def test_no_override_file_means_no_second_volume() -> None:
    policy = parse_policy_text("shim: {overrideFile: ''}\n")
    out = apply(
        pod(container(gpu="4")), list(plan(pod(container(gpu="4")), Prepared(policy)).patch)
    )
    assert [v["name"] for v in out["spec"]["volumes"]] == ["gpushare-shim", "gpushare-accounting"]


def test_the_threat_model_lists_every_variable_the_shim_reads() -> None:
    text = (ROOT / "docs/security.md").read_text()
    rows = [f"| `{v.name}` | {v.shim} | {v.webhook} |" for v in contract.VARIABLES]
    missing = [row for row in rows if row not in text]
    assert not missing, (
        "docs/security.md must show webhook.decision.contract.VARIABLES as table rows:\n"
        + "\n".join(missing)
    )


def test_the_pinned_entries_are_the_pinned_values_in_order() -> None:
    pinned = layout_of(DEFAULT_POLICY).pin("train", 4, 2, 50)
    entries = list(pinned.entries)
    assert entries == [{"name": name, "value": value} for name, value in pinned.values.items()]
    assert pinned.env == [
        *entries,
        {"name": "LD_PRELOAD", "value": DEFAULT_POLICY.shim.preload},
    ]
    assert pinned.values["CUDA_DEVICE_MEMORY_LIMIT_1"] == "4096m"
    assert pinned.values["CUDA_DEVICE_SM_LIMIT_1"] == "50"


def test_a_prepared_policy_makes_the_pinned_values_of_an_ask_once() -> None:
    """The pinned env of an ask is shared by every pod of the policy that asks the same."""
    prepared = Prepared(DEFAULT_POLICY)
    one, two = (
        pod(container("train", gpu="4", env=[{"name": "A", "value": "B"}])) for _ in range(2)
    )
    first, second = (plan(obj, prepared).ops for obj in (one, two))
    assert first == second
    env = {op.path: op.value for op in first}["/spec/containers/0/env"]
    again = {op.path: op.value for op in second}["/spec/containers/0/env"]
    shared = [a for a, b in zip(env, again, strict=True) if a is b]
    assert {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "4096m"} in shared


def test_the_accounting_volume_holds_sixteen_whole_regions() -> None:
    # NB: past its sizeLimit the kubelet evicts the pod; regions are sparse, so this is the bound.
    assert parse_quantity(ACCOUNTING_SIZE).value >= 16 * contract.REGION_BYTES
