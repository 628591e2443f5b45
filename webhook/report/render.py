"""A report as a person reads it (aligned tables, totals) and as a program does (JSON).

Owns both forms of ``gpushare-webhook report``'s output. The JSON's shape
is a contract (documented in docs/report.md): every key is always there,
lists are sorted, counts name every status, whether or not it occurs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from webhook.report.claims import Device, Held
from webhook.report.findings import NodeUsage, PodFinding, Report, WorkloadFinding
from webhook.report.reserved import Gpu

API_VERSION = "gpushare-webhook.io/v1"
POD_STATUSES = ("confined", "drifted", "would-be-refused", "warned", "excluded")
WORKLOAD_STATUSES = ("ok", "would-be-refused", "warned", "excluded")


def _counts(statuses: Sequence[str], names: Sequence[str]) -> dict[str, int]:
    return {name: sum(1 for status in statuses if status == name) for name in names}


def as_json(report: Report) -> dict[str, Any]:
    by_pod = {(p.namespace, p.name): p for p in report.pods}
    statuses = _statuses(report)
    return {
        "apiVersion": API_VERSION,
        "kind": "Report",
        "unit": report.unit,
        "clean": report.clean,
        "summary": {
            "pods": _counts([p.status for p in report.pods], POD_STATUSES),
            "workloads": _counts([w.status for w in report.workloads], WORKLOAD_STATUSES),
            "unaccounted": report.unaccounted,
            "unanswered": sum(len(w.pods) for w in report.unanswered),
            "refusedByGuard": len(report.refused),
            "findings": len(report.findings),
        },
        "pods": [_pod(p) for p in report.pods],
        "workloads": [_workload(w) for w in report.workloads],
        "nodes": [_node(n, statuses) for n in report.nodes],
        "draDevices": [_dra_device(d, by_pod) for d in report.devices],
        "unanswered": [
            {"schedulerName": w.scheduler, "pods": list(w.pods), "message": w.message}
            for w in report.unanswered
        ],
        "refusedByGuard": [
            {
                "namespace": r.namespace,
                "kind": r.kind,
                "name": r.name,
                "count": r.count,
                "lastSeen": r.last,
                "message": r.message,
            }
            for r in report.refused
        ],
        "findings": list(report.findings),
        "notes": list(report.notes),
    }


def _statuses(report: Report) -> dict[tuple[str, str], str]:
    return {(p.namespace, p.name): p.status for p in report.pods}


def _pod(pod: PodFinding) -> dict[str, Any]:
    return {
        "namespace": pod.namespace,
        "name": pod.name,
        "node": pod.node,
        "status": pod.status,
        "gpuMemory": pod.held_per_pod,
        "withoutLimit": pod.unlimited,
        "findings": list(pod.findings),
        "cause": pod.cause,
        "gpu": pod.gpu,
        "reserved": pod.reserved,
        "usedBytes": pod.used_bytes,
        "draDevices": list(pod.devices),
        "claimedBytes": pod.claimed_bytes,
    }


def _workload(workload: WorkloadFinding) -> dict[str, Any]:
    return {
        "kind": workload.kind,
        "namespace": workload.namespace,
        "name": workload.name,
        "status": workload.status,
        "findings": list(workload.findings),
    }


def _node(node: NodeUsage, statuses: dict[tuple[str, str], str]) -> dict[str, Any]:
    return {
        "name": node.name,
        "gpus": len(node.record.gpus),
        "memoryPerGpu": node.record.capacity.per_gpu,
        "total": node.total,
        "used": node.used,
        "free": node.free,
        "pods": node.pods,
        "withoutLimit": list(node.unlimited),
        "unaccounted": [f"{p.namespace}/{p.name}" for p in node.record.unaccounted],
        "devices": [_device(gpu, statuses) for gpu in node.record.gpus],
    }


def _device(gpu: Gpu, statuses: dict[tuple[str, str], str]) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "total": gpu.total,
        "used": gpu.used,
        "free": gpu.free,
        "pods": [
            {
                "namespace": p.namespace,
                "name": p.name,
                "reserved": p.reserved,
                "heldPerGpu": p.held_per_gpu,
                "status": statuses.get((p.namespace, p.name), ""),
            }
            for p in gpu.pods
        ],
    }


def _dra_device(device: Device, by_pod: dict[tuple[str, str], PodFinding]) -> dict[str, Any]:
    return {
        "node": device.node,
        "driver": device.driver,
        "pool": device.pool,
        "device": device.name,
        "totalBytes": device.total_bytes,
        "heldBytes": device.held_bytes,
        "shares": [_dra_share(h, by_pod.get((h.namespace, h.pod))) for h in device.held],
    }


def _dra_share(held: Held, pod: PodFinding | None) -> dict[str, Any]:
    return {
        "namespace": held.namespace,
        "name": held.pod,
        "claim": held.claim,
        "shareID": held.share,
        "heldBytes": held.held_bytes,
        "usedBytes": None if pod is None else pod.used_bytes,
        "status": "" if pod is None else pod.status,
    }


Row = tuple[str, ...]


def _table(header: Row, rows: Sequence[Row]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def as_table(report: Report) -> str:
    out = _pods(report) + _workloads(report) + _nodes(report) + _gpus(report)
    out += _dra(report) + _unanswered(report) + _refused(report) + _findings(report)
    out.append(_summary(report))
    out.extend(f"note: {note}" for note in report.notes)
    return "\n".join(out) + "\n"


def _pods(report: Report) -> list[str]:
    if not report.pods:
        return []
    header = ("NAMESPACE", "POD", "NODE", f"GPU MEMORY ({report.unit})", "USED (MiB)", "STATUS")
    rows = [
        (p.namespace, p.name, p.node or "-", str(p.held_per_pod), _mib(p.used_bytes), p.status)
        for p in report.pods
    ]
    lines = _table(header, rows)
    out = ["GPU PODS", lines[0]]
    for pod, line in zip(report.pods, lines[1:], strict=True):
        out.append(line)
        out.extend(f"    - {finding}" for finding in pod.findings)
        if pod.claimed_bytes is not None:
            out.append(
                f"    its claims hold {_mib(pod.claimed_bytes)} MiB on {', '.join(pod.devices)}"
            )
        if pod.cause:
            out.append(f"    likely cause: {pod.cause}")
    return [*out, ""]


def _mib(used: int | None) -> str:
    return "-" if used is None else str(used // 2**20)


def _workloads(report: Report) -> list[str]:
    if not report.workloads:
        return []
    rows = [(w.kind, w.namespace, w.name, w.status) for w in report.workloads]
    lines = _table(("KIND", "NAMESPACE", "NAME", "STATUS"), rows)
    out = ["GPU WORKLOADS", lines[0]]
    for workload, line in zip(report.workloads, lines[1:], strict=True):
        out.append(line)
        out.extend(f"    - {finding}" for finding in workload.findings)
    return [*out, ""]


def _nodes(report: Report) -> list[str]:
    if not report.nodes:
        return []
    unit = report.unit
    header: Row = ("NODE", "GPUS", f"PER GPU ({unit})", f"TOTAL ({unit})", f"USED ({unit})")
    header += (f"FREE ({unit})", "GPU PODS", "WITHOUT LIMITS")
    rows: list[Row] = []
    for n in report.nodes:
        per_gpu = str(n.record.capacity.per_gpu) if n.record.gpus else "-"
        rows.append((n.name, str(len(n.record.gpus)), per_gpu, str(n.total), str(n.used)))
        rows[-1] += (str(n.free), str(n.pods), ", ".join(n.unlimited) or "-")
    nodes = report.nodes
    total, used = sum(n.total for n in nodes), sum(n.used for n in nodes)
    rows.append(("TOTAL", str(sum(len(n.record.gpus) for n in nodes)), "", str(total), str(used)))
    rows[-1] += (str(sum(n.free for n in nodes)), str(sum(n.pods for n in nodes)))
    rows[-1] += (str(sum(len(n.unlimited) for n in nodes)),)
    return ["GPU NODES", *_table(header, rows), ""]


def _gpus(report: Report) -> list[str]:
    """Each GPU, as ``kubectl inspect gpushare -d`` shows it; then who no one accounts for."""
    if not report.nodes:
        return []
    unit, statuses = report.unit, _statuses(report)
    header: Row = ("NODE", "GPU", f"TOTAL ({unit})", f"USED ({unit})", f"FREE ({unit})", "PODS")
    rows: list[Row] = []
    for node in report.nodes:
        for gpu in node.record.gpus:
            pods = ", ".join(
                f"{p.namespace}/{p.name} ({p.reserved} {unit}, "
                f"{statuses.get((p.namespace, p.name), 'not judged')})"
                for p in gpu.pods
            )
            rows.append((node.name, str(gpu.index), str(gpu.total), str(gpu.used)))
            rows[-1] += (str(gpu.free), pods or "-")
    out = ["GPUS", *_table(header, rows), ""] if rows else []
    for node in report.nodes:
        if node.record.unaccounted:
            out.append(
                f"{node.name}: GPU pods the scheduler extender reserved no GPU memory for, on "
                "GPUs nobody accounts for: "
                + ", ".join(f"{p.namespace}/{p.name}" for p in node.record.unaccounted)
            )
    return [*out, ""] if out and out[-1] else out


def _dra(report: Report) -> list[str]:
    """Each DRA device the webhook's claims hold shares of: its shares, for whom."""
    if not report.devices:
        return []
    statuses = {(p.namespace, p.name): p for p in report.pods}
    header: Row = ("NODE", "DEVICE", "TOTAL (MiB)", "HELD (MiB)", "FREE (MiB)", "PODS")
    rows: list[Row] = []
    for device in report.devices:
        pods = []
        for held in device.held:
            found = statuses.get((held.namespace, held.pod))
            measured = None if found is None else found.used_bytes
            used = "" if measured is None else f", used {_mib(measured)} MiB"
            status = "not judged" if found is None else found.status
            pods.append(
                f"{held.namespace}/{held.pod} ({_mib(held.held_bytes)} MiB{used}, {status})"
            )
        total = device.total_bytes
        free = "-" if total is None else _mib(total - device.held_bytes)
        rows.append((device.node or "-", device.id, _mib(total), _mib(device.held_bytes), free))
        rows[-1] += (", ".join(pods),)
    return ["DRA GPUS (what the ResourceClaims hold)", *_table(header, rows), ""]


def _findings(report: Report) -> list[str]:
    if not report.findings:
        return []
    return ["FINDINGS", *report.findings, ""]


def _unanswered(report: Report) -> list[str]:
    if not report.unanswered:
        return []
    return ["WAITING FOR A SCHEDULER", *(w.message for w in report.unanswered), ""]


def _refused(report: Report) -> list[str]:
    if not report.refused:
        return []
    lines = [
        f"{r.namespace}/{r.name} ({r.kind}, {r.count} times, last {r.last or 'unknown'}): "
        f"{r.message}"
        for r in report.refused
    ]
    return ["REFUSED BY THE GUARD (the webhook did not set these pods up)", *lines, ""]


def _summary(report: Report) -> str:
    pods = _counts([p.status for p in report.pods], POD_STATUSES)
    workloads = _counts([w.status for w in report.workloads], WORKLOAD_STATUSES)
    said = ", ".join(f"{count} {status.replace('-', ' ')}" for status, count in pods.items())
    told = ", ".join(f"{count} {status.replace('-', ' ')}" for status, count in workloads.items())
    verdict = "all confined" if report.clean else "needs attention"
    more = ""
    if report.unaccounted:
        more += f"; {report.unaccounted} bound GPU pods the scheduler reserved no GPU memory for"
    waiting = sum(len(w.pods) for w in report.unanswered)
    if waiting:
        more += f"; {waiting} GPU pods wait for a scheduler nobody answers"
    if report.refused:
        more += f"; {len(report.refused)} controllers' pods refused by the guard"
    if report.findings:
        more += f"; {len(report.findings)} findings of the cluster"
    return (
        f"{len(report.pods)} GPU pods: {said}; {len(report.workloads)} GPU workloads: {told}"
        f"{more} ({verdict})"
    )
