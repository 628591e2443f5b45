"""Watching the API's objects as an informer does: Nodes, and what ``scheduler: dra`` reads.

Owns the list-then-watch of one kind in a background thread (:class:`Watcher`),
and what it knows of it: each object as the caller converts it, and how
the watch is doing. :class:`NodeWatcher` follows Nodes for their GPU
capacity (labels and extended resources); the same loop follows
ResourceSlices, DeviceClasses, pending pods and claim templates
(``webhook.cluster.watchprocess``). ``serve --watch-nodes`` runs them in a
process of its own, which shares the facts with every worker as a
snapshot file.

A kind the cluster may lack (resource.k8s.io/v1 on an older API server,
or one the RBAC does not grant) is ``optional``: its 404 or 403 is said
once, not at every step of the backoff, and the other watches go on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import socket
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.cluster import kube
from webhook.decision import NodeFacts, NodeStatus, facts_of

log = logging.getLogger("gpushare_webhook.nodes")
T = TypeVar("T")


class _Gone(Exception):
    """The watch's resourceVersion is older than the API server keeps (410): list again."""


@dataclasses.dataclass
class _WatchState:
    """What one pass of the list-then-watch loop leaves for the next."""

    version: str | None = None  # where the watch resumes; None: list first
    streamed: int = 0  # events the current watch has delivered
    failures: int = 0  # in a row, for the backoff


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


@dataclasses.dataclass(frozen=True)
class Resource:
    """One kind a watch follows: where it is listed, and what a 403 asks to be granted."""

    path: str  # "/api/v1/nodes"
    what: str  # "nodes", in messages
    name: str  # "node", of the watch in log lines ("node watch: ...")
    grant: str = ""  # where the grant is, for a 403
    field_selector: str = ""
    optional: bool = False  # absent or refused: said once, and the other watches go on


RBAC = "see the ClusterRole in manifests/base/rbac.yaml"  # where every watched kind is granted
NODES = Resource("/api/v1/nodes", "nodes", "node", RBAC)


def key_of(obj: dict[str, Any]) -> str:
    """``namespace/name`` (``name`` for a cluster-scoped object): where it is kept."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name") or "")


class Watcher(Generic[T]):
    """A list-then-watch of one kind in a background thread, as an informer does.

    The watch resumes from the last resourceVersion after a broken stream,
    and lists again after 410 Gone (make_api should give a client with
    retries=0: the backoff here is the only retry, logged once a step).
    While the API is unreachable the last
    known nodes stay in force; until a first list succeeds (or when no node
    reports GPU memory) reviews fall back to the policy's ``gpuMemory``, and
    the view says so. ``label_selector`` narrows the watch to some objects.
    ``convert`` makes what is kept of each object; ``on_object``, if
    given, is told of each listed, added or modified object as it comes,
    in the watch's thread (what must act at once: a pending pod).
    """

    def __init__(
        self,
        make_api: Callable[[], client.ApiClient],
        resource: Resource,
        convert: Callable[[dict[str, Any]], T],
        *,
        on_object: Callable[[str, dict[str, Any]], None] | None = None,
        label_selector: str = "",
        watch_timeout: int = 300,
        request_timeout: float = 15.0,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self._make_api = make_api
        self.resource, self._convert, self._on_object = resource, convert, on_object
        self._said = ""  # the problem of an optional kind, said once
        self.label_selector = label_selector
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
        self.backoff = backoff
        self._lock = threading.Lock()
        self._facts: dict[str, T] = {}
        self._version = 0  # bumps on every change of _facts or of the status
        self._status = NodeStatus(watching=True, problem=f"{resource.what} not read yet")
        self._stop = threading.Event()
        self._api: client.ApiClient | None = None
        self._stream: Any = None  # the watch's response, closed to stop it
        self._thread: threading.Thread | None = None
        self.lists = 0
        self.watches = 0

    # -- reading (other threads) --

    def status(self) -> NodeStatus:
        return self._status

    @property
    def version(self) -> int:
        """A number that changes whenever the facts or the status do."""
        return self._version

    def snapshot(self) -> tuple[int, NodeStatus, tuple[T, ...]]:
        """The version, status and facts, taken together."""
        with self._lock:
            return self._version, self._status, tuple(self._facts.values())

    def __contains__(self, key: str) -> bool:
        """Whether the object ``key`` (:func:`key_of`) is known."""
        with self._lock:
            return key in self._facts

    # -- the watch (its own thread) --

    def start(self) -> None:
        self._stop.clear()
        name = f"{self.resource.name}-watch"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        # Closing the response would wait for the thread reading it (they
        # share a lock); shutting its socket down ends that read at once.
        sock = getattr(
            getattr(getattr(self._stream, "response", None), "connection", None), "sock", None
        )
        if sock is not None:
            with contextlib.suppress(OSError):  # closed already
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout)

    def _set(self, **changes: Any) -> None:
        old = self._status
        with self._lock:
            self._status = dataclasses.replace(old, **changes)
            self._version += 1
        if old.problem and not self._status.problem:
            what, name = self.resource.what, self.resource.name
            log.info("%s watch: connected again, %d %s known", name, self._status.nodes, what)

    def _replace(self, facts: dict[str, T]) -> None:
        with self._lock:
            self._facts = facts
            self._version += 1

    def _get(self, query: dict[str, str], timeout: float | tuple[float, float]) -> Any:
        selectors = {
            "labelSelector": self.label_selector,
            "fieldSelector": self.resource.field_selector,
        }
        return kube.get_json(self._api, self.resource.path, {**selectors, **query}, timeout=timeout)

    @staticmethod
    def _event(event: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(type, object) of one watch event; an ERROR event is raised as the API's error."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        return str(kind), obj

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = key_of(obj)
        with self._lock:
            if kind == "DELETED":
                self._facts.pop(key, None)
            else:
                self._facts[key] = self._convert(obj)
            self._version += 1
            self._status = dataclasses.replace(self._status, nodes=len(self._facts))
        if self._on_object is not None and kind != "DELETED":
            self._on_object(kind, obj)

    def _run(self) -> None:
        self._api = api = self._make_api()
        state = _WatchState()
        while not self._stop.is_set():
            problem = self._attempt(api, state)
            if problem is None:
                continue
            if self._stop.is_set():
                return  # stopped: the cut stream was ours
            self._back_off(problem, state)

    def _attempt(self, api: client.ApiClient, state: _WatchState) -> str | None:
        """List if need be, then watch: the problem that ended it, or None to go on at once."""
        state.streamed = 0
        try:
            if state.version is None:
                state.version = self._list()
            self._watch(state, since=state.version)
            state.failures = 0
            return None
        except _Gone:
            state.version = None  # older than the API server keeps: list again
            return None
        except ApiException as error:
            if error.status == 410:
                state.version = None  # older than the API server keeps: list again
                return None
            return self._refused(error)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            if state.streamed:
                # A stream cut after it delivered events: resume where it stopped.
                return None
            problem = f"cannot reach the Kubernetes API at {api.configuration.host}"
            return problem + f" ({unreachable(error)})"
        except Exception as error:  # the thread must outlive any surprise from the API
            log.exception("%s watch failed", self.resource.name)
            return f"{type(error).__name__}: {error}"

    def _refused(self, error: ApiException) -> str:
        what = self.resource.what
        if error.status == 403:
            return (
                f"forbidden to list or watch {what}: grant the service account 'list' and "
                f"'watch' on {what} ({self.resource.grant})"
            )
        if error.status == 404 and self.resource.optional:
            return f"the API server does not serve {self.resource.path}"
        return f"HTTP {error.status} {error.reason}"

    def _list(self) -> str:
        """Replace what is known with a fresh list; its resourceVersion."""
        listed = self._get({}, self.request_timeout)
        page = json.loads(listed.read())
        self.lists += 1
        items = page.get("items") or []
        self._replace({key_of(item): self._convert(item) for item in items})
        version: str = page["metadata"]["resourceVersion"]
        self._said = ""
        self._set(tried=True, synced=True, connected=True, problem="", nodes=len(items))
        if self._on_object is not None:
            for item in items:
                self._on_object("ADDED", item)
        return version

    def _watch(self, state: _WatchState, *, since: str) -> None:
        """Apply the watch's events from ``since`` until the API server ends the stream.

        ``state`` moves on with each event, not at the end, so that a stream
        cut midway resumes after the last event it delivered.
        """
        self.watches += 1
        query = {
            "watch": "true",
            "resourceVersion": since,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout),
        }
        self._stream = self._get(query, (self.request_timeout, self.watch_timeout + 30))
        for line in self._stream.response:
            if not line.strip():
                continue
            state.streamed += 1
            kind, obj = self._event(json.loads(line))
            if kind != "BOOKMARK":
                self._apply(kind, obj)
            state.version = (obj.get("metadata") or {}).get("resourceVersion") or state.version

    def _back_off(self, problem: str, state: _WatchState) -> None:
        """Report ``problem``, then wait longer after each failure in a row (capped, jittered)."""
        state.failures += 1
        self._set(tried=True, connected=False, problem=problem)
        # After a failure, list again once the API answers: that both proves
        # the connection and catches up on whatever the watch missed.
        state.version = None
        low, high = self.backoff
        delay = random.uniform(0.5, 1.0) * min(high, low * 2 ** (state.failures - 1))
        name = self.resource.name
        if not self.resource.optional:
            # One line per step of the backoff, which says when the next one is.
            log.warning("%s watch: %s; trying again in %.2g s", name, problem, delay)
        elif problem != self._said:
            # A cluster without the kind is a steady state, not a failure to repeat.
            self._said = problem
            log.warning(
                "%s watch: %s; going on without them, trying again now and then", name, problem
            )
        self._stop.wait(delay)


class NodeWatcher(Watcher[NodeFacts]):
    """The Nodes, as facts (labels and extended-resource capacity), by name.

    ``label_selector`` narrows the watch to some nodes (``gpushare=true``:
    the nodes the GPU-share device plugin runs on).
    """

    def __init__(
        self,
        make_api: Callable[[], client.ApiClient],
        *,
        label_selector: str = "",
        watch_timeout: int = 300,
        request_timeout: float = 15.0,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        super().__init__(
            make_api,
            NODES,
            facts_of,
            label_selector=label_selector,
            watch_timeout=watch_timeout,
            request_timeout=request_timeout,
            backoff=backoff,
        )
