"""Invariants over random pods: the patch applies, the result is a valid Pod, and a fixed point.

Pods are drawn from a strategy that covers what users write: several
containers and init containers, GPU and plain ones, existing env (including
LD_PRELOAD and the limit variable), volumes and mounts, annotations or none.
"""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import GPU, apply, container, decode_patch, env_of, examples, pod, review
from webhook.decision.admission import admit
from webhook.decision.plan import STATUS_ANNOTATION, plan
from webhook.decision.policy import DEFAULT_POLICY
from webhook.decision.prepared import Prepared

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


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods())
def test_patch_applies_validates_and_is_a_fixed_point(obj: dict[str, Any]) -> None:
    decision = plan(obj, Prepared(DEFAULT_POLICY))
    if not decision.allowed:
        # A drawn pod may fail only for not fitting one GPU, or for an init
        # container asking more than the extender reserves (the app containers' sum).
        assert decision.reason in {"exceeds-gpu", "init-exceeds-reservation"}, decision.message
        assert decision.gpu_pod.held_per_gpu == 0
        return
    out = apply(obj, list(decision.patch))
    kubernetes_validate.validate(out, K8S_VERSION, strict=True)
    again = plan(out, Prepared(DEFAULT_POLICY))
    assert again.allowed
    assert again.patch == (), again.patch
    assert decision.gpu_pod.held_per_gpu <= DEFAULT_POLICY.gpu_memory
    for ask in decision.asks:
        container = out["spec"][ask.kind][ask.position]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["CUDA_DEVICE_MEMORY_LIMIT"] == f"{ask.memory_per_gpu * 1024}m"
        assert env["LD_PRELOAD"].split(":")[0] == DEFAULT_POLICY.shim.preload
        names = [e["name"] for e in container["env"]]
        assert names.count("LD_PRELOAD") == 1
        assert names.count("CUDA_DEVICE_MEMORY_LIMIT") == 1


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.text(min_size=1, max_size=12), value=st.text(max_size=24))
def test_the_patch_text_carries_any_name_and_value(name: str, value: str) -> None:
    # The patch is written as JSON text piece by piece (webhook.decision.patch):
    # quotes, backslashes, control and non-ASCII characters in what the user
    # wrote must come back out of it exactly.
    env = [{"name": "LD_PRELOAD", "value": value}, {"name": "X", "value": value}]
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"a": value}},
        "spec": {
            "containers": [
                {"name": name, "image": "busybox", "env": env, "resources": {"limits": {GPU: "1"}}}
            ]
        },
    }
    decision = plan(obj, Prepared(DEFAULT_POLICY))
    assert decision.allowed, decision.message
    out = apply(obj, list(decision.patch))
    got = env_of(out["spec"]["containers"][0])
    assert got["X"] == value
    shim = DEFAULT_POLICY.shim.preload
    others = [p for p in re.split(r"[:\s]+", value) if p and p != shim]
    assert got["LD_PRELOAD"] == ":".join([shim, *others])
    status = json.loads(out["metadata"]["annotations"][STATUS_ANNOTATION])
    assert list(status["containers"]) == [name]
    assert plan(out, Prepared(DEFAULT_POLICY)).patch == ()


def test_a_lone_surrogate_goes_back_escaped() -> None:
    # "\ud800" in a review decodes to a string with no UTF-8 form; the answer
    # must still be written (never an internal error) and carry it back.
    body = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "object": {
                    "metadata": {"name": "p"},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "env": [{"name": "LD_PRELOAD", "value": "/a\ud800.so"}],
                                "resources": {"limits": {GPU: "1"}},
                            }
                        ]
                    },
                },
            },
        }
    ).encode()
    result = admit(body, Prepared(DEFAULT_POLICY))
    assert result.outcome == "mutated", result.body
    ops = decode_patch(json.loads(result.encode())["response"])
    (env,) = [op["value"] for op in ops if op["path"] == "/spec/containers/0/env"]
    assert env[0]["value"] == f"{DEFAULT_POLICY.shim.preload}:/a\ud800.so"


LONE = "\ud800"  # a lone surrogate: valid in JSON text, with no UTF-8 form
ANYWHERE = {
    "uid": review(pod(container(gpu="1")), uid=LONE),
    "namespace": review(pod(container(gpu="1")), namespace=LONE),
    "container name": review(pod(container(LONE, gpu="1"))),
    "rejected container": review(pod(container(LONE, gpu="99"))),
    "env value": review(pod(container(gpu="1", env=[{"name": "X", "value": LONE}]))),
    "env name": review(pod(container(gpu="1", env=[{"name": LONE, "value": "1"}]))),
    "quantity": review(pod(container(gpu=LONE))),
    "other pod": review(pod(container(env=[{"name": LONE, "value": LONE}]))),
}


@pytest.mark.parametrize("reviewed", ANYWHERE.values(), ids=ANYWHERE.keys())
def test_a_lone_surrogate_anywhere_is_answered(reviewed: dict[str, Any]) -> None:
    # Such a string reaches the answer (the uid is echoed, names go into
    # warnings and messages); the answer must still be written.
    result = admit(json.dumps(reviewed).encode(), Prepared(DEFAULT_POLICY))
    assert result.outcome != "error", result.error
    answer = json.loads(result.encode())
    assert answer["response"]["uid"] == reviewed["request"]["uid"]
