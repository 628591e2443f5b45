"""Watching Nodes for their GPU capacity, as an informer does.

Owns the list-then-watch of Nodes in a background thread per serving
process, and the view of the cluster's GPUs it keeps for the decision
(``webhook.decision.capacity.NodeView``).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from webhook.decision.capacity import NodeFacts, NodeStatus, NodeView, gpu_nodes
from webhook.decision.policy import Policy

log = logging.getLogger("gpushare_webhook.nodes")


def _facts(node: Any) -> NodeFacts:
    meta, status = node.metadata, node.status
    return NodeFacts(
        name=meta.name or "",
        labels=dict(meta.labels or {}),
        capacity=dict((status.capacity if status is not None else None) or {}),
    )


def unreachable(error: BaseException) -> str:
    """Why the API could not be reached, in a few words ("[Errno 111] Connection refused").

    urllib3 wraps the socket's error in a MaxRetryError and a connection
    error whose text repeats the pool, host and port; the innermost reason
    is what a person needs, the host is said once by the caller.
    """
    reason = getattr(error, "reason", None)
    if isinstance(error, urllib3.exceptions.MaxRetryError) and isinstance(reason, BaseException):
        error = reason
    text = str(error) or type(error).__name__
    if isinstance(error, urllib3.exceptions.NewConnectionError):
        text = text.rpartition("new connection: ")[2] or text
    elif isinstance(error, urllib3.exceptions.NameResolutionError):
        text = text.partition("(")[2].rstrip(")") or text
    return text


class NodeWatcher:
    """A list-then-watch of Nodes in a background thread, as an informer does.

    The watch resumes from the last resourceVersion after a broken stream,
    and lists again after 410 Gone (make_api should give a client with
    retries=0: the backoff here is the only retry, logged once a step).
    While the API is unreachable the last
    known nodes stay in force; until a first list succeeds (or when no node
    reports GPU memory) reviews fall back to the policy's ``gpuMemory``, and
    the view says so. Start it in each serving process (threads do not
    survive a fork).
    """

    def __init__(
        self,
        make_api: Callable[[], client.ApiClient],
        *,
        watch_timeout: int = 300,
        request_timeout: float = 15.0,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self._make_api = make_api
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
        self.backoff = backoff
        self._lock = threading.Lock()
        self._facts: dict[str, NodeFacts] = {}
        self._version = 0  # bumps on every change of _facts
        self._cache: tuple[int, Policy, NodeView] | None = None
        self._status = NodeStatus(watching=True, problem="node list not read yet")
        self._stop = threading.Event()
        self._tried = threading.Event()  # set once the first list has been answered or failed
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self.lists = 0
        self.watches = 0

    # -- reading (request threads) --

    def status(self) -> NodeStatus:
        return self._status

    def view(self, policy: Policy) -> NodeView:
        cache = self._cache
        if cache is not None and cache[0] == self._version and cache[1] is policy:
            return cache[2]
        with self._lock:
            version, facts, status = self._version, tuple(self._facts.values()), self._status
        fallback = (
            f"GPU sizes come from the policy's gpuMemory ({policy.gpu_memory} {policy.memory_unit})"
        )
        if not status.synced:
            why = status.problem or "not read yet"
            result = NodeView(note=f"{fallback}: the cluster's node list is not available ({why})")
        else:
            nodes = gpu_nodes(facts, policy)
            result = (
                NodeView(nodes=nodes)
                if nodes
                else NodeView(note=f"{fallback}: no node reports {policy.resource_name}")
            )
        self._cache = (version, policy, result)
        return result

    # -- the watch (its own thread) --

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="node-watch", daemon=True)
        self._thread.start()

    def start_and_wait(self, timeout: float = 5.0) -> None:
        """Start, and give the first list up to ``timeout`` to arrive.

        Each worker runs its own watch; waiting here (after fork, before the
        worker takes connections) keeps a new worker from bounding pods by
        the policy's guess while the cluster's answer is a few ms away. An
        API that does not answer in time only delays the worker, which then
        falls back as usual.
        """
        self.start()
        self._tried.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def _set(self, **changes: Any) -> None:
        old = self._status
        self._status = dataclasses.replace(old, **changes)
        if self._status.tried:
            self._tried.set()
        if old.problem and not self._status.problem:
            log.info("node watch: connected again, %d nodes known", self._status.nodes)

    def _replace(self, facts: dict[str, NodeFacts]) -> None:
        with self._lock:
            self._facts = facts
            self._version += 1

    def _apply(self, kind: str, node: Any) -> None:
        facts = _facts(node)
        with self._lock:
            if kind == "DELETED":
                self._facts.pop(facts.name, None)
            else:
                self._facts[facts.name] = facts
            self._version += 1
            count = len(self._facts)
        self._status = dataclasses.replace(self._status, nodes=count)

    def _run(self) -> None:
        core = client.CoreV1Api(self._make_api())
        version: str | None = None
        failures = 0
        while not self._stop.is_set():
            streamed = 0
            try:
                if version is None:
                    listed = core.list_node(_request_timeout=self.request_timeout)
                    self.lists += 1
                    self._replace({n.metadata.name: _facts(n) for n in listed.items})
                    version = listed.metadata.resource_version
                    self._set(
                        tried=True, synced=True, connected=True, problem="", nodes=len(listed.items)
                    )
                self.watches += 1
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    core.list_node,
                    resource_version=version,
                    timeout_seconds=self.watch_timeout,
                    allow_watch_bookmarks=True,
                    _request_timeout=(self.request_timeout, self.watch_timeout + 30),
                ):
                    streamed += 1
                    node = event["object"]
                    if event["type"] != "BOOKMARK":
                        self._apply(event["type"], node)
                    version = node.metadata.resource_version or version
                failures = 0
                continue
            except ApiException as error:
                if error.status == 410:
                    # The resourceVersion is older than the apiserver keeps: list again.
                    version = None
                    continue
                problem = (
                    "forbidden to list or watch nodes: grant the service account 'list' and "
                    "'watch' on nodes (see the ClusterRole in manifests/base/rbac.yaml)"
                    if error.status == 403
                    else f"HTTP {error.status} {error.reason}"
                )
            except (urllib3.exceptions.HTTPError, OSError) as error:
                if streamed:
                    # A stream cut after it delivered events: resume where it stopped.
                    continue
                problem = f"cannot reach the Kubernetes API at {core.api_client.configuration.host}"
                problem += f" ({unreachable(error)})"
            except Exception as error:  # the thread must outlive any surprise from the API
                log.exception("node watch failed")
                problem = f"{type(error).__name__}: {error}"
            failures += 1
            self._set(tried=True, connected=False, problem=problem)
            # After a failure, list again once the API answers: that both proves
            # the connection and catches up on whatever the watch missed.
            version = None
            low, high = self.backoff
            delay = random.uniform(0.5, 1.0) * min(high, low * 2 ** (failures - 1))
            # One line per step of the backoff, which says when the next one is.
            log.warning("node watch: %s; trying again in %.2g s", problem, delay)
            self._stop.wait(delay)
