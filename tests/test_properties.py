"""Invariants over random pods: the patch applies, the result is a valid Pod, and a fixed point.

Pods are drawn from a strategy that covers what users write: several
containers and init containers, GPU and plain ones, existing env (including
LD_PRELOAD and the limit variable), volumes and mounts, annotations or none.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import GPU, apply
from webhook.planning import plan
from webhook.policy import DEFAULT_POLICY

K8S_VERSION = "1.37.0"
NAMES = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
ENV_NAMES = st.sampled_from(["LD_PRELOAD", "CUDA_DEVICE_MEMORY_LIMIT", "MODEL", "HOME", "PATH"])
ENV = st.lists(
    st.builds(
        lambda n, v: {"name": n, "value": v}, ENV_NAMES, st.sampled_from(["", "/opt/a.so", "1g x"])
    ),
    max_size=4,
)


@st.composite
def containers(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 4))
    out = []
    for index in range(count):
        c: dict[str, Any] = {"name": f"{prefix}{index}", "image": "busybox"}
        gpu = draw(st.one_of(st.none(), st.integers(1, 4)))
        if gpu is not None:
            both = draw(st.booleans())
            c["resources"] = {
                "limits": {GPU: str(gpu)},
                **({"requests": {GPU: str(gpu)}} if both else {}),
            }
        env = draw(ENV)
        if env:
            c["env"] = env
        if draw(st.booleans()):
            c["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        out.append(c)
    return out


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(containers("c"))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(containers("i"))
    uses_data = any(
        "volumeMounts" in c for c in spec["containers"] + spec.get("initContainers", [])
    )
    if uses_data or draw(st.booleans()):
        spec["volumes"] = [{"name": "data", "emptyDir": {}}]
    if draw(st.booleans()):
        spec["schedulerName"] = "default-scheduler"
    metadata: dict[str, Any] = {"name": draw(NAMES)}
    if draw(st.booleans()):
        metadata["annotations"] = {"team": draw(NAMES)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods())
def test_patch_applies_validates_and_is_a_fixed_point(obj: dict[str, Any]) -> None:
    decision = plan(obj, DEFAULT_POLICY)
    if not decision.allowed:
        # The only reason a drawn pod may fail is that it does not fit one GPU.
        assert decision.reason == "exceeds-gpu", decision.message
        assert decision.demand == 0
        return
    out = apply(obj, list(decision.patch))
    kubernetes_validate.validate(out, K8S_VERSION, strict=True)
    again = plan(out, DEFAULT_POLICY)
    assert again.allowed
    assert again.patch == (), again.patch
    assert decision.demand <= DEFAULT_POLICY.gpu_memory
    for ask in decision.asks:
        container = out["spec"][ask.kind][ask.position]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["CUDA_DEVICE_MEMORY_LIMIT"] == f"{ask.memory * 1024}m"
        assert env["LD_PRELOAD"].split(":")[0] == DEFAULT_POLICY.shim.preload
        names = [e["name"] for e in container["env"]]
        assert names.count("LD_PRELOAD") == 1
        assert names.count("CUDA_DEVICE_MEMORY_LIMIT") == 1
