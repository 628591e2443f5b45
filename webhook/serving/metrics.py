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

NB: writing a count to those files takes a lock and an mmap write per
value, four to five values per review: a few percent of a worker's time.
So each review is only tallied in memory, and the tally goes to the files
at most ``FLUSH_INTERVAL`` later (by a thread of each worker, before every
scrape that worker answers, and when it exits): a scrape may see another
worker's last second of reviews on the next one, as with any scrape.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from webhook.decision import BYTES_PER_MIB, GpuNode, NodeSource, Result
from webhook.serving.runtime import METRICS_ENV, PolicySource

log = logging.getLogger("gpushare_webhook.metrics")
ENV = METRICS_ENV
# Admission answers take 0.1–5 ms here; the apiserver's default timeout is 10 s.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)
FLUSH_INTERVAL = 1.0  # seconds a review may wait in a worker's tally


def reserved_bytes(result: Result) -> int:
    """GPU memory the scheduler holds for the pod over all of its GPUs (its model's), in bytes."""
    return 0 if result.decision is None else result.decision.gpu_pod.held_per_pod_bytes


@dataclass
class Tally:
    """Reviews a process answered since its counts last went to the metric files."""

    reviews: dict[tuple[str, str], int] = field(default_factory=dict)  # (outcome, reason)
    # Observations per bucket, as prometheus-client keeps them: index i is the
    # first bound at or above the duration, the last index is +Inf.
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    seconds: float = 0.0
    fallback: int = 0
    pods: dict[str, int] = field(default_factory=dict)  # by namespace
    memory: dict[str, int] = field(default_factory=dict)  # bytes, by namespace


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
        self._tally = Tally()
        self._lock = threading.Lock()
        self._flusher_pid = 0

    def observe(self, result: Result, seconds: float, *, fallback: bool) -> None:
        outcome, reason = result.outcome, result.reason.value
        # A warned pod is admitted too; it counts as a GPU pod if any of it asks GPU memory.
        admitted = outcome in ("mutated", "unchanged", "warned") and not result.dry_run
        memory = reserved_bytes(result) if admitted else 0
        if self._flusher_pid != os.getpid():
            self._start_flushing()
        with self._lock:
            tally = self._tally
            key = (outcome, reason)
            tally.reviews[key] = tally.reviews.get(key, 0) + 1
            tally.buckets[bisect_left(BUCKETS, seconds)] += 1
            tally.seconds += seconds
            if fallback and outcome not in ("untouched", "bad-request"):
                tally.fallback += 1  # only GPU pods are bounded by the GPU size
            if memory:
                namespace = result.namespace
                tally.pods[namespace] = tally.pods.get(namespace, 0) + 1
                tally.memory[namespace] = tally.memory.get(namespace, 0) + memory

    def flush(self) -> None:
        """Add what this process tallied to the metric files (or memory)."""
        with self._lock:
            if not self._tally.reviews:  # every review is counted there
                return
            tally, self._tally = self._tally, Tally()
        for (outcome, reason), count in tally.reviews.items():
            self.reviews.labels(outcome, reason).inc(count)
        # NB: Histogram has no call for many observations at once; these are
        # the values its observe() adds to, one per bucket and the sum.
        for bucket, count in zip(self.duration._buckets, tally.buckets, strict=True):
            if count:
                bucket.inc(count)
        self.duration._sum.inc(tally.seconds)
        if tally.fallback:
            self.fallback.inc(tally.fallback)
        for namespace, count in tally.pods.items():
            self.pods.labels(namespace).inc(count)
        for namespace, count in tally.memory.items():
            self.memory.labels(namespace).inc(count)

    def _start_flushing(self) -> None:
        """Flush from a thread of this process (a worker, after fork) and at its exit."""
        with self._lock:
            if self._flusher_pid == os.getpid():
                return
            self._flusher_pid = os.getpid()
        threading.Thread(target=self._flush_forever, name="metrics-flush", daemon=True).start()
        atexit.register(self.flush)

    def _flush_forever(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL)
            try:
                self.flush()
            except Exception:  # a full disk must not stop the counting for good
                log.exception("writing metrics failed")

    def connection_cut(self, reason: str, count: int) -> None:
        self.cut.labels(reason).inc(count)

    def render(self) -> tuple[bytes, str]:
        self.flush()
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

        expiry = self._cert_expiry()
        if expiry is not None:
            yield _gauge(
                "gpushare_certificate_expiry_timestamp_seconds",
                "When the serving certificate expires",
                expiry,
            )

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
