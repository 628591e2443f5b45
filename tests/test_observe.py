"""Metrics and log lines, in one process: what each admission leaves behind."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client import Histogram

from tests.helpers import container, pod, review, swap
from webhook.decision.admission import admit
from webhook.decision.capacity import GpuBounds, GpuNode
from webhook.decision.nodesource import NodeStatus, NoNodes
from webhook.decision.policy import DEFAULT_POLICY, Policy
from webhook.decision.prepared import Prepared
from webhook.serving import logs
from webhook.serving.app import State, create_app
from webhook.serving.metrics import BUCKETS, Metrics
from webhook.serving.runtime import PolicySource


def scrape(client: FlaskClient) -> dict[str, float]:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.content_type.startswith("text/plain")
    values = {}
    for line in resp.get_data(as_text=True).splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def make(policy: PolicySource | None = None, nodes: object = None) -> FlaskClient:
    source = policy or PolicySource()
    node_source = nodes or NoNodes()
    state = State(policy=source, nodes=node_source, metrics=Metrics(source, node_source))  # type: ignore[arg-type]
    return create_app(state).test_client()


def post(client: FlaskClient, body: object) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert client.post("/mutate", data=data, content_type="application/json").status_code in (
        200,
        400,
    )


def test_metrics_are_off_without_a_collector() -> None:
    resp = create_app().test_client().get("/metrics")
    assert resp.status_code == 404


def test_each_outcome_is_counted_with_its_reason() -> None:
    client = make()
    post(client, review(pod(container(gpu="4"))))
    post(client, review(pod(container(gpu="4")), namespace="team-b"))
    post(client, review(pod(container(gpu="99"))))
    post(client, review(pod(container("web"))))
    post(client, b"[]")
    dry = review(pod(container(gpu="2")))
    dry["request"]["dryRun"] = True
    post(client, dry)
    values = scrape(client)
    count = "gpushare_admission_reviews_total"
    assert values[f'{count}{{outcome="mutated",reason="mutated"}}'] == 3
    assert values[f'{count}{{outcome="rejected",reason="exceeds-gpu"}}'] == 1
    assert values[f'{count}{{outcome="untouched",reason="no-gpu-request"}}'] == 1
    assert values[f'{count}{{outcome="bad-request",reason="bad-request"}}'] == 1
    assert values["gpushare_admission_duration_seconds_count"] == 6
    # Dry runs are answered but not counted as admitted.
    assert values['gpushare_admitted_gpu_pods_total{namespace="team-a"}'] == 1
    assert values['gpushare_admitted_gpu_memory_bytes_total{namespace="team-b"}'] == 4 * 2**30
    assert values["gpushare_gpu_sizes_from_policy"] == 1
    assert values["gpushare_node_watch_enabled"] == 0
    assert values["gpushare_largest_gpu_memory_bytes"] == 16 * 2**30


def test_a_warned_pod_is_counted_as_warned_and_as_admitted(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("enforcement: warn\n")
    client = make(PolicySource(policy))
    answer = client.post(
        "/mutate",
        data=json.dumps(review(pod(container(gpu="40"), container("ok", gpu="4")))),
        content_type="application/json",
    ).get_json()["response"]
    assert answer["allowed"] is True
    assert answer["auditAnnotations"] == {"decision": "warned", "reason": "exceeds-gpu"}
    assert answer["warnings"][0].startswith("gpushare-webhook would refuse this pod: ")
    post(client, review(pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]))))
    values = scrape(client)
    count = "gpushare_admission_reviews_total"
    assert values[f'{count}{{outcome="warned",reason="exceeds-gpu"}}'] == 1
    assert values[f'{count}{{outcome="warned",reason="visible-devices"}}'] == 1
    # Admitted and holding GPU memory (44 GiB: its GPU could never hold it);
    # the pod that asks none is no GPU pod.
    assert values['gpushare_admitted_gpu_pods_total{namespace="team-a"}'] == 1
    assert values['gpushare_admitted_gpu_memory_bytes_total{namespace="team-a"}'] == 44 * 2**30


def test_durations_land_in_the_histograms_buckets() -> None:
    durations = [0.0, 0.0004, 0.0005, 0.00051, 0.003, 0.01, 0.7, 2.5, 9.99, 10.0, 12.0, 600.0]
    direct = Histogram("d", "d", buckets=BUCKETS, registry=None)
    for seconds in durations:
        direct.observe(seconds)
    expected = {s.labels["le"]: s.value for s in direct.collect()[0].samples if "le" in s.labels}
    source, nodes = PolicySource(), NoNodes()
    metrics = Metrics(source, nodes)
    result = admit(json.dumps(review(pod(container(gpu="1")))).encode(), Prepared(DEFAULT_POLICY))
    for seconds in durations:
        metrics.observe(result, seconds, fallback=False)
    values = scrape(create_app(State(policy=source, nodes=nodes, metrics=metrics)).test_client())
    name = "gpushare_admission_duration_seconds"
    got = {le: values[f'{name}_bucket{{le="{le}"}}'] for le in expected}
    assert got == expected
    assert values[f"{name}_count"] == len(durations)
    assert values[f"{name}_sum"] == pytest.approx(sum(durations))
    assert values['gpushare_admitted_gpu_pods_total{namespace="team-a"}'] == len(durations)


def test_a_refused_policy_shows_as_stale_until_fixed(tmp_path: Path) -> None:
    swap(tmp_path, "gpuMemory: 24\n", 1)
    source = PolicySource(tmp_path / "policy.yaml", interval=0)
    client = make(source)
    swap(tmp_path, "gpuMemory: many\n", 2)
    values = scrape(client)  # a scrape checks the file too, with no reviews coming in
    assert values["gpushare_policy_stale"] == 1
    assert values["gpushare_policy_reload_failures_total"] == 1
    assert values["gpushare_largest_gpu_memory_bytes"] == 24 * 2**30
    swap(tmp_path, "gpuMemory: 40\n", 3)
    values = scrape(client)
    assert values["gpushare_policy_stale"] == 0
    assert values["gpushare_policy_reloads_total"] == 1
    assert values["gpushare_largest_gpu_memory_bytes"] == 40 * 2**30


class Fixed:
    """A node source with a fixed answer, for the app's side of the seam."""

    def __init__(self, status: NodeStatus, nodes: tuple[GpuNode, ...] = (), **view: Any) -> None:
        self._nodes, self._view, self._status = nodes, view, status

    def prepared(self, policy: Policy) -> Prepared:
        return Prepared(policy, self._nodes, **self._view)

    def status(self) -> NodeStatus:
        return self._status


def test_node_fallback_is_a_warning_and_a_count() -> None:
    note = "GPU sizes come from the policy's gpuMemory (16 GiB): no node reports aliyun.com/gpu-mem"
    client = make(nodes=Fixed(NodeStatus(watching=True, tried=True), note=note))
    resp = client.post("/mutate", json=review(pod(container(gpu="4"))))
    assert resp.get_json()["response"]["warnings"] == [note]
    denied = client.post("/mutate", json=review(pod(container(gpu="40")))).get_json()["response"]
    assert denied["warnings"] == [note]
    plain = client.post("/mutate", json=review(pod(container("web")))).get_json()["response"]
    assert "warnings" not in plain  # not a GPU pod: the bound does not matter
    assert scrape(client)["gpushare_gpu_size_fallback_reviews_total"] == 2


def test_known_nodes_are_reported() -> None:
    nodes = (GpuNode("a", 80, 8), GpuNode("b", 24, 1))
    client = make(nodes=Fixed(NodeStatus(True, True, True, True, "", 5), nodes, uncounted=("c",)))
    values = scrape(client)
    assert values["gpushare_gpu_nodes"] == 2
    assert values["gpushare_gpu_nodes_without_count"] == 1
    assert values["gpushare_nodes_known"] == 5
    assert values["gpushare_largest_gpu_memory_bytes"] == 80 * 2**30
    assert values["gpushare_gpu_sizes_from_policy"] == 0


def test_admission_log_line_has_the_decision_and_no_pod(caplog: pytest.LogCaptureFixture) -> None:
    client = make()
    caplog.set_level(logging.INFO, logger="gpushare_webhook.admission")
    post(client, review(pod(container(gpu="99")), uid="u-1"))
    (record,) = [r for r in caplog.records if r.name == "gpushare_webhook.admission"]
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["uid"] == "u-1"
    assert fields["decision"] == "rejected"
    assert fields["reason"] == "exceeds-gpu"
    assert "asks 99 GiB" in fields["detail"]
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["level"] == "info"
    assert line["message"] == "admission"
    assert line["uid"] == "u-1"
    assert "nvcr.io" not in json.dumps(line)  # the image, and so the spec, is not logged


class BrokenNodes(NoNodes):
    """Nodes whose bounds fail: a bug, which no real node source makes on demand."""

    class _Prepared(Prepared):
        def bounds(self, spec: Mapping[str, Any]) -> GpuBounds:
            raise RuntimeError("no bounds")

    def prepared(self, policy: Policy) -> Prepared:
        return self._Prepared(policy)


def test_an_internal_error_has_one_reason_in_log_metric_and_audit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = make(nodes=BrokenNodes())
    caplog.set_level(logging.INFO, logger="gpushare_webhook.admission")
    answer = client.post(
        "/mutate", data=json.dumps(review(pod(container(gpu="4")))), content_type="application/json"
    ).get_json()["response"]
    assert answer["auditAnnotations"] == {"decision": "error", "reason": "internal"}
    (record,) = [r for r in caplog.records if r.name == "gpushare_webhook.admission"]
    assert record.fields["reason"] == "internal"  # type: ignore[attr-defined]
    count = "gpushare_admission_reviews_total"
    assert scrape(client)[f'{count}{{outcome="error",reason="internal"}}'] == 1


def test_bad_requests_log_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    client = make()
    caplog.set_level(logging.INFO, logger="gpushare_webhook.admission")
    post(client, b"{nope")
    (record,) = [r for r in caplog.records if r.name == "gpushare_webhook.admission"]
    assert record.levelno == logging.WARNING
    assert "not valid JSON" in record.fields["error"]  # type: ignore[attr-defined]


def test_text_format_puts_fields_after_the_message() -> None:
    record = logging.LogRecord("x", logging.INFO, "f", 1, "admission", (), None)
    record.fields = {"uid": "u", "decision": "mutated"}
    assert logs.TextFormatter().format(record) == "INFO x admission uid=u decision=mutated"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("choice", "stream", "chosen"),
    [
        ("auto", Terminal(), "text"),
        ("auto", io.StringIO(), "json"),  # a pipe or a file: a collector reads it
        ("json", Terminal(), "json"),
        ("text", io.StringIO(), "text"),
    ],
    ids=["auto-terminal", "auto-pipe", "json-forced", "text-forced"],
)
def test_log_format_follows_the_terminal_unless_chosen(
    choice: str, stream: io.StringIO, chosen: str
) -> None:
    assert logs.chosen_format(choice, stream) == chosen


def test_a_log_line_is_one_write_of_a_whole_line(tmp_path: Path) -> None:
    target = tmp_path / "log"
    with target.open("wb") as out:
        handler = logs.LineHandler(out.fileno())
        handler.setFormatter(logs.JsonFormatter())
        record = logging.LogRecord(
            "gpushare_webhook.admission", logging.INFO, "", 0, "admission", None, None
        )
        record.fields = {"pod": "tränen", "decision": "mutated"}
        handler.emit(record)
        handler.emit(record)
    lines = target.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0])["pod"] == "tränen"


def test_log_times_match_datetime_to_the_millisecond() -> None:
    # The formatter caches the date and time to the second; every line must
    # still read exactly as datetime would print it, carries included.
    formatter = logs.JsonFormatter()
    base = 1_796_000_000
    moments = [base + 0.0, base + 0.0004, base + 0.4269999, base + 0.9999996, base + 1.5]
    moments += [base + 59.999, base + 60.001, 557_537_194.426, 0.0, base - 0.25]
    for created in moments:
        expected = dt.datetime.fromtimestamp(created, dt.UTC).isoformat(timespec="milliseconds")
        assert formatter.timestamp(created) == expected, created
