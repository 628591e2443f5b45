"""Prometheus metrics: the only module that imports ``prometheus_client``.

Two kinds of figures. Counts (reviews, latency, GPU memory admitted) are
kept by every gunicorn worker in prometheus-client's multiprocess files and
summed at scrape time, so a scrape that lands on any worker sees them all.
State (policy staleness, node watch, GPU sizes, certificate expiry) is read
live from the scraping worker when the scrape comes in: every worker loads
the same policy file, watches the same nodes and serves the same
certificate, so any one of them can speak for the process.

prometheus-client chooses its storage when it is first imported, from
``PROMETHEUS_MULTIPROC_DIR``: ``serve`` sets it (with
``webhook.serving.runtime.prepare_metrics_directory``) before importing this module.
Each review goes to the counters as it is answered.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from webhook.decision import BYTES_PER_MIB, GpuNode, NodeSource, Result
from webhook.serving.nodefile import SharedNodes
from webhook.serving.runtime import METRICS_ENV, PolicySource

log = logging.getLogger("gpushare_webhook.metrics")
ENV = METRICS_ENV
# Admission answers take 0.1–5 ms here; the apiserver's default timeout is 10 s.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)


def reserved_bytes(result: Result) -> int:
    """GPU memory the scheduler holds for the pod over all of its GPUs (its model's), in bytes."""
    return 0 if result.decision is None else result.decision.gpu_pod.held_per_pod_bytes


class Metrics:
    """The counters one process updates, and the /metrics page."""

    def __init__(
        self,
        policy: PolicySource,
        nodes: NodeSource,
        cert: Path | None = None,
    ) -> None:
        self.reviews = Counter(
            "gpushare_admission_reviews",
            "AdmissionReviews answered, by outcome (mutated, unchanged, untouched, rejected, "
            "warned, error, bad-request) and reason",
            ["outcome", "reason"],
            registry=None,
        )
        self.duration = Histogram(
            "gpushare_admission_duration_seconds",
            "Time to answer one AdmissionReview, from body read to response built",
            buckets=BUCKETS,
            registry=None,
        )
        self.fallback = Counter(
            "gpushare_gpu_size_fallback_reviews",
            "GPU pods checked against the policy's gpuMemory although node watching is on "
            "(no node list yet, or no node reports GPU memory)",
            registry=None,
        )
        self.pods = Counter(
            "gpushare_admitted_gpu_pods",
            "GPU pods admitted (not dry runs), by namespace",
            ["namespace"],
            registry=None,
        )
        self.memory = Counter(
            "gpushare_admitted_gpu_memory_bytes",
            "GPU memory reserved by admitted pods (not dry runs), by namespace",
            ["namespace"],
            registry=None,
        )
        self.cut = Counter(
            "gpushare_connections_cut",
            "Connections closed before a whole request came: read-timeout (slow or silent "
            "clients), plain-http, not-tls, tls-handshake, incomplete",
            ["reason"],
            registry=None,
        )
        self._counted = (
            self.reviews,
            self.duration,
            self.fallback,
            self.pods,
            self.memory,
            self.cut,
        )
        self.live = LiveState(policy, nodes, cert)

    def observe(self, result: Result, seconds: float, *, fallback: bool) -> None:
        outcome = result.outcome
        self.reviews.labels(outcome, result.reason.value).inc()
        self.duration.observe(seconds)
        if fallback and outcome not in ("untouched", "bad-request"):
            self.fallback.inc()  # only GPU pods are bounded by the GPU size
        # A warned pod is admitted too; it counts as a GPU pod if any of it asks GPU memory.
        if outcome in ("mutated", "unchanged", "warned") and not result.dry_run:
            memory = reserved_bytes(result)
            if memory:
                self.pods.labels(result.namespace).inc()
                self.memory.labels(result.namespace).inc(memory)

    def connection_cut(self, reason: str, count: int) -> None:
        self.cut.labels(reason).inc(count)

    def render(self) -> tuple[bytes, str]:
        registry = CollectorRegistry(auto_describe=True)
        if os.environ.get(ENV):
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        else:  # one process (tests, the app under another server): count in memory
            for metric in self._counted:
                registry.register(metric)
        registry.register(self.live)
        return generate_latest(registry), CONTENT_TYPE_LATEST


class LiveState(Collector):
    """Gauges read from this process's own state at scrape time."""

    def __init__(self, policy: PolicySource, nodes: NodeSource, cert: Path | None) -> None:
        self.policy = policy
        self.nodes = nodes
        self.cert = cert
        self._cert_cache: tuple[tuple[int, int], float] | None = None

    def collect(self) -> Iterator[Metric]:
        source = self.policy
        policy = source.get()  # a scrape also notices a changed file with no traffic
        yield _gauge(
            "gpushare_policy_stale",
            "1 when the policy file holds a policy that was refused; the last good one is in force",
            int(source.stale),
        )
        yield _gauge(
            "gpushare_policy_loaded_timestamp_seconds",
            "When the policy in force was loaded",
            source.loaded_at,
        )
        reloads = CounterMetricFamily("gpushare_policy_reloads", "Policy changes applied")
        reloads.add_metric([], source.reloads)
        yield reloads
        failures = CounterMetricFamily(
            "gpushare_policy_reload_failures", "Policy changes refused as invalid"
        )
        failures.add_metric([], source.failures)
        yield failures

        status = self.nodes.status()
        view = self.nodes.prepared(policy)
        gpu_nodes: tuple[GpuNode, ...] = tuple(view.nodes or ())
        yield _gauge(
            "gpushare_node_watch_enabled", "1 when --watch-nodes is on", int(status.watching)
        )
        yield _gauge(
            "gpushare_node_watch_connected",
            "1 when the last call of the node watch to the API succeeded",
            int(status.connected),
        )
        yield _gauge("gpushare_nodes_known", "Nodes the watch knows, GPU or not", status.nodes)
        yield _gauge("gpushare_gpu_nodes", "Nodes that report GPU memory", len(gpu_nodes))
        yield _gauge(
            "gpushare_gpu_nodes_without_count",
            "Nodes that report GPU memory but no GPU count, where the scheduler counts no GPU",
            len(view.uncounted),
        )
        largest = max((n.gpu_memory for n in gpu_nodes), default=policy.gpu_memory)
        yield _gauge(
            "gpushare_largest_gpu_memory_bytes",
            "Memory of the largest single GPU pods are checked against",
            largest * policy.mib_per_unit * BYTES_PER_MIB,
        )
        yield _gauge(
            "gpushare_gpu_sizes_from_policy",
            "1 when GPU sizes come from the policy's gpuMemory instead of the nodes",
            int(view.nodes is None),
        )
        yield from self._dra(view.mapped)

        expiry = self._cert_expiry()
        if expiry is not None:
            yield _gauge(
                "gpushare_certificate_expiry_timestamp_seconds",
                "When the serving certificate expires",
                expiry,
            )

    def _dra(self, mapped: tuple[tuple[str, str], ...]) -> Iterator[Metric]:
        """What ``scheduler: dra`` and KEP-5004 bring: mapping DeviceClasses, templates made."""
        yield _gauge(
            "gpushare_deviceclasses_mapping_gpu_resources",
            "DeviceClasses whose extendedResourceName is one of the policy's resources, "
            "which kube-scheduler then serves as whole GPUs (KEP-5004)",
            len(mapped),
        )
        # Without the node watch nothing makes templates: the counts are 0, not absent.
        templates = (
            self.nodes.templates()
            if isinstance(self.nodes, SharedNodes)
            else {"created": 0, "failures": 0}
        )
        made = CounterMetricFamily(
            "gpushare_claim_templates_created",
            "ResourceClaimTemplates the node watch made for pending scheduler: dra pods",
        )
        made.add_metric([], templates["created"])
        yield made
        refused = CounterMetricFamily(
            "gpushare_claim_template_failures",
            "ResourceClaimTemplates the node watch failed to make (RBAC, quota)",
        )
        refused.add_metric([], templates["failures"])
        yield refused

    def _cert_expiry(self) -> float | None:
        if self.cert is None:
            return None
        from webhook import tls

        try:
            stat = self.cert.stat()
            key = (stat.st_mtime_ns, stat.st_ino)
            if self._cert_cache is None or self._cert_cache[0] != key:
                cert = tls.parse_certs(self.cert.read_bytes())[0]
                self._cert_cache = (key, cert.not_valid_after_utc.timestamp())
        except (OSError, IndexError, tls.CertificateError):
            return None  # missing for a moment during a rotation: say nothing rather than 0
        return self._cert_cache[1]


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
