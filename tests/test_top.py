"""``top``: an agent's metrics read back, and the rows per node, GPU and pod, pure."""

from __future__ import annotations

import pytest

from webhook.decision.policy import DEFAULT_POLICY
from webhook.errors import InputError
from webhook.node.scraped import Used, containers
from webhook.report.top import Top, as_json, as_table, build_top

GIB, MIB = 2**30, 2**20
GPU = "aliyun.com/gpu-mem"


def _line(name: str, pod: str, container: str, value: str, device: str = "device") -> str:
    labels = f'namespace="ml",pod="{pod}",container="{container}",{device}="0",device_uuid="G"'
    return f"{name}{{{labels}}} {value}\n"


USED, TAMPERED = (
    "gpushare_container_gpu_memory_used_bytes",
    "gpushare_container_gpu_region_tampered",
)
OURS = (
    _line(USED, "a", "main", "1073741824.0")
    + _line(USED, "a", "side", "536870912.0")
    + _line(TAMPERED, "a", "side", "1.0")
    + _line(TAMPERED, "a", "main", "0.0")
    + 'gpushare_node_regions_skipped{reason="torn"} 0.0\n'
)
HAMI = _line(
    "hami_vgpu_memory_used_bytes", "b", "main", "2.147483648e+09", "vdevice_index"
) + _line("hami_vgpu_memory_limit_bytes", "b", "main", "4.294967296e+09", "vdevice_index")


def test_an_agents_metrics_read_back_in_either_naming() -> None:
    assert containers(OURS) == [
        Used("ml", "a", "main", "0", GIB, tampered=False),
        Used("ml", "a", "side", "0", GIB // 2, tampered=True),
    ]
    assert containers(HAMI) == [Used("ml", "b", "main", "0", 2 * GIB, tampered=False)]


def test_text_that_is_not_metrics_is_an_input_error() -> None:
    with pytest.raises(InputError, match="not Prometheus metrics"):
        containers('x{a="1"} not-a-number\n')


STATUS = '{"containers":{"main":{"memory":"4096m"},"side":{"memory":"1024m"}}}'


def _pod(name: str, node: str | None, *, gpu: str | None = "0", reserved: str | None = "5",
         status: str | None = STATUS, phase: str = "Running") -> dict[str, object]:  # fmt: skip
    annotations = {"gpushare-webhook.io/status": status} if status else {}
    if gpu is not None:
        annotations["ALIYUN_COM_GPU_MEM_IDX"] = gpu
    if reserved is not None:
        annotations["ALIYUN_COM_GPU_MEM_POD"] = reserved
    meta = {"uid": f"uid-{name}", "namespace": "ml", "name": name, "annotations": annotations}
    # The limit is what the scheduler holds for the pod, from its model: 4 + 1 GiB.
    asks = [
        {"name": n, "resources": {"limits": {GPU: m}}} for n, m in (("main", "4"), ("side", "1"))
    ]
    return {
        "metadata": meta,
        "spec": {"containers": asks, **({"nodeName": node} if node else {})},
        "status": {"phase": phase},
    }


PODS = [
    _pod("a", "n1"),
    _pod("c", "n1", gpu="1", reserved="8", status=None),  # placed by the extender, never admitted
    _pod("d", "n2", gpu=None, reserved=None),  # bound past the extender
    _pod("pending", None),
    _pod("done", "n1", phase="Succeeded"),
    _pod("cpu", "n1", gpu=None, reserved=None, status=None),
]


def _top() -> Top:
    reports: dict[str, list[Used] | str] = {"n1": containers(OURS), "n2": "agent x: HTTP 503"}
    return build_top(PODS, DEFAULT_POLICY, reports)


def test_each_gpu_pod_with_what_was_reserved_admitted_and_used() -> None:
    assert as_json(_top())["pods"] == [
        {"node": "n1", "gpu": 0, "namespace": "ml", "pod": "a", "reservedBytes": 5 * GIB,
         "limitBytes": 5 * GIB, "usedBytes": GIB + GIB // 2, "tampered": True, "devices": []},
        {"node": "n1", "gpu": 1, "namespace": "ml", "pod": "c", "reservedBytes": 8 * GIB,
         "limitBytes": None, "usedBytes": None, "tampered": False, "devices": []},
        {"node": "n2", "gpu": None, "namespace": "ml", "pod": "d", "reservedBytes": None,
         "limitBytes": 5 * GIB, "usedBytes": None, "tampered": False, "devices": []},
    ]  # fmt: skip


def test_per_gpu_totals_and_the_nodes_not_reached() -> None:
    top = _top()
    assert as_json(top)["gpus"] == [
        {"node": "n1", "gpu": 0, "reservedBytes": 5 * GIB, "limitBytes": 5 * GIB,
         "usedBytes": GIB + GIB // 2, "pods": 1, "device": ""},
        {"node": "n1", "gpu": 1, "reservedBytes": 8 * GIB, "limitBytes": 0, "usedBytes": 0,
         "pods": 1, "device": ""},
        {"node": "n2", "gpu": None, "reservedBytes": 0, "limitBytes": 5 * GIB, "usedBytes": 0,
         "pods": 1, "device": ""},
    ]  # fmt: skip
    assert top.unreached == ("n2: agent x: HTTP 503",)
    assert not top.clean


def test_a_node_without_an_agent_is_named() -> None:
    top = build_top([_pod("a", "n1")], DEFAULT_POLICY, {})
    assert top.unreached == ("n1: no node agent runs there",)


def test_the_table_reads_like_kubectl_top() -> None:
    assert as_table(_top()).splitlines() == [
        "NODE   GPU   NAMESPACE   POD            RESERVED   LIMIT    USED     USED/LIMIT",
        "n1     0     ml          a (tampered)   5120Mi     5120Mi   1536Mi   30%",
        "n1     1     ml          c              8192Mi     -        -        -",
        "n2     -     ml          d              -          5120Mi   -        -",
        "not reached: n2: agent x: HTTP 503",
    ]
