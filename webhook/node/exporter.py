"""The node agent's metrics: each GPU container's use, limit and admitted limit, per device.

Owns the Prometheus side of ``gpushare-webhook node metrics``: a collector
that scans the regions when a scrape comes in (nothing runs between
scrapes), names them in ours or in HAMi's metric names, and logs a tampered
region once per container. The pods come from a callable the command line
hands in (the API, or a saved list), called again when a region names a pod
uid it does not know, at most every ``refresh`` seconds.
"""

from __future__ import annotations

import enum
import errno
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from webhook.errors import InputError, WebhookError
from webhook.node.regions import LAYOUT, Skip
from webhook.node.usage import Pod, Sample, Scan, index, scan

log = logging.getLogger("gpushare_webhook.node")

PodLister = Callable[[], Iterable[Mapping[str, Any]]]


class Names(enum.Enum):
    """Which names the per-container figures go by: ours, or HAMi's vGPU monitor's."""

    GPUSHARE = "gpushare"
    HAMI = "hami"


class Naming(NamedTuple):
    """The names of the figures that follow a naming; the rest keep ours either way."""

    used: str
    limit: str
    utilization: str
    device_label: str


NAMINGS = {
    Names.GPUSHARE: Naming(
        used="gpushare_container_gpu_memory_used_bytes",
        limit="gpushare_container_gpu_memory_limit_bytes",
        utilization="gpushare_container_gpu_utilization_percent",
        device_label="device",
    ),
    # HAMi's vGPUmonitor (pkg/monitor/nvidia): its dashboards query these.
    Names.HAMI: Naming(
        used="hami_vgpu_memory_used_bytes",
        limit="hami_vgpu_memory_limit_bytes",
        utilization="hami_container_device_utilization_ratio",
        device_label="vdevice_index",
    ),
}
TAMPERED = "gpushare_container_gpu_region_tampered"  # read back by ``top`` (webhook.node.scraped)


class RegionCollector(Collector):
    def __init__(
        self, pods_dir: Path, list_pods: PodLister, *, names: Names, refresh: float = 30.0
    ) -> None:
        self.pods_dir = pods_dir
        self.list_pods = list_pods
        self.names = names
        self.refresh = refresh
        self.pods: dict[str, Pod] = {}
        self.listed_at = -float("inf")
        self.list_failures = 0
        self.tampered_logged: set[tuple[str, str, int]] = set()

    def _relist(self) -> None:
        try:
            self.pods = index(self.list_pods())
        except WebhookError as error:  # the API away: keep the pods we knew, say so once a try
            self.list_failures += 1
            log.warning("cannot list this node's pods: %s", error)
        self.listed_at = time.monotonic()

    def scan(self) -> Scan:
        if time.monotonic() - self.listed_at >= self.refresh:
            self._relist()
        found = scan(self.pods_dir, self.pods)
        if found.unknown and time.monotonic() - self.listed_at >= min(self.refresh, 2.0):
            self._relist()  # a pod started since the last list: name it on this scrape
            found = scan(self.pods_dir, self.pods)
        return found

    def collect(self) -> Iterator[Metric]:
        found = self.scan()
        yield from self._containers(found)
        yield from self._node(found)

    def _containers(self, found: Scan) -> tuple[Metric, ...]:
        """The per-container, per-device figures of every region found."""
        naming = NAMINGS[self.names]
        labels = ["namespace", "pod", "container", naming.device_label, "device_uuid"]
        used = GaugeMetricFamily(
            naming.used, "GPU memory the container's processes use", labels=labels
        )
        limit = GaugeMetricFamily(naming.limit, "GPU memory limit the shim enforces", labels=labels)
        util = GaugeMetricFamily(
            naming.utilization, "SM utilisation of the container (percent)", labels=labels
        )
        admitted = GaugeMetricFamily(
            "gpushare_container_gpu_memory_admitted_bytes",
            "GPU memory limit the webhook admitted the container with",
            labels=labels,
        )
        procs = GaugeMetricFamily(
            "gpushare_container_gpu_processes", "Processes in the container's region", labels=labels
        )
        tampered = GaugeMetricFamily(
            TAMPERED,
            "1 when the region's limit differs from the one the webhook admitted",
            labels=labels,
        )
        for sample in found.samples:
            values = _labels(sample)
            used.add_metric(values, sample.device.used_bytes)
            limit.add_metric(values, sample.device.limit_bytes)
            util.add_metric(values, sample.device.sm_util)
            procs.add_metric(values, sample.processes)
            if sample.admitted_bytes is not None:
                admitted.add_metric(values, sample.admitted_bytes)
                tampered.add_metric(values, int(sample.tampered))
            self._log_tamper(sample)
        return (used, limit, util, admitted, procs, tampered)

    def _node(self, found: Scan) -> tuple[Metric, ...]:
        """What the scan and the pod lists came to, and the layout the agent reads."""
        skipped = GaugeMetricFamily(
            "gpushare_node_regions_skipped",
            "Region files this scrape could not use, by reason",
            labels=["reason"],
        )
        for reason in Skip:
            skipped.add_metric([reason.value], found.skipped[reason])
        unknown = GaugeMetricFamily(
            "gpushare_node_regions_unknown_pod",
            "Regions of pod uids the API does not list on this node",
            value=found.unknown,
        )
        failures = GaugeMetricFamily(
            "gpushare_node_pod_list_failures",
            "Failed lists of this node's pods since the agent started",
            value=self.list_failures,
        )
        info = GaugeMetricFamily(
            "gpushare_node_region_layout_info",
            "The HAMi-core region layout the agent reads",
            labels=["hami_core_commit", "version"],
        )
        info.add_metric([LAYOUT.commit, f"{LAYOUT.major}.{LAYOUT.minor}"], 1)
        return (skipped, unknown, failures, info)

    def _log_tamper(self, sample: Sample) -> None:
        key = (sample.pod.uid, sample.container, sample.device.index)
        if not sample.tampered:
            self.tampered_logged.discard(key)
            return
        if key in self.tampered_logged:
            return
        self.tampered_logged.add(key)
        log.warning(
            "tampered region: pod %s/%s container %s device %d enforces %d bytes, admitted %s",
            sample.pod.namespace,
            sample.pod.name,
            sample.container,
            sample.device.index,
            sample.device.limit_bytes,
            sample.admitted_bytes,
        )


def _labels(sample: Sample) -> list[str]:
    pod = sample.pod
    return [pod.namespace, pod.name, sample.container, str(sample.device.index), sample.device.uuid]


def serve(collector: RegionCollector, host: str, port: int) -> None:
    """Serve ``/metrics`` on ``host:port`` until interrupted."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:  # a busy port, an address not on this host: one line, no traceback
        if error.errno == errno.EADDRINUSE:
            raise InputError(
                f"--listen {host}:{port}: port {port} is already in use (by another program, or "
                "another node agent); stop it or choose another port"
            ) from None
        raise InputError(f"--listen {host}:{port}: cannot listen there ({error})") from None
    log.info("serving node metrics on %s:%d from %s", host, port, collector.pods_dir)
    try:
        thread.join()
    finally:
        server.shutdown()
