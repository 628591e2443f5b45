"""What a pod waits for: create to bound and Running, through admission and scheduling.

    python bench/run.py --scheduler [--quick]

Starts the scheduling tier of the tests (tests/controlplane/scheduling.py:
the control plane, kube-scheduler in the extender's install-guide
configuration, the real GPU Share Scheduler Extender, KWOK playing 100
fake nodes (20 with --quick) of 8 GPUs x 16 GiB), installs the webhook
from the manifests as deployed (the shipped policy: the extender in
default-scheduler), then creates GPU pods (1 to 4 GiB) from 1 and 8
creator threads, each on its own keep-alive connection, each creating its
next pod once its last one runs; and from 1 creator paced to a pod every
0.6 s, below the rate the extender binds at. Rounds with the webhook
registered alternate with rounds without it (its
MutatingWebhookConfiguration deleted, then created again as it was), so
that the machine's drift hits both; a dry-run probe makes sure the API
server has seen the change before a round starts, and every pod is
checked to be mutated or not as its round says.

Then the same through kube-scheduler's Dynamic Resource Allocation
(bench/dra.py): the same nodes publish their GPUs as ResourceSlices, the
webhook serves ``scheduler: dra``, and a round with it (pods asking
``aliyun.com/gpu-mem``, turned into claims) alternates with one of the
pods a user writes by hand (``spec.resourceClaims`` from a template made
beforehand), from 1 and 8 creators, twice as many pods a round (as many
with --quick). DRA's pods/s are put over the extender's measured in the
same run. Where they fall short of 20 times at 8 creators with
kube-controller-manager's and kube-scheduler's clients at their default
limits, DRA's rounds run again with the limits a large cluster gives them
(``dra.RAISED_LIMITS``).

One watch on the pods' namespace stamps, with the local clock, when each
pod's nodeName appears (bound) and when its phase becomes Running (KWOK);
a pod's time starts when its create is sent. Pods are deleted, and the
extender's view of the GPUs (or the namespace's ResourceClaims) emptied,
between rounds. Reports p50/p99 of create to bound and create to
Running, pods/s from the first create to the last pod bound, the create
call's own p50, and the webhook's share of the time to be bound, (p50
with - p50 without) / p50 with; the goal is at most 10% at 8 creators.
Not a test: it never fails on a timing.

The extender binds with client-go's default client limits (5 requests/s;
a bind is a patch of the pod's annotations and a Binding), so about 2.5
pods/s bind however many create them: unpaced, a pod's time to be bound
is mostly its wait for the extender's client, and the webhook's share is
seen best in the paced figures. Under DRA the clients that write are
kube-controller-manager's (the resourceclaim controller makes each pod's
claim and writes the pod's status: 20 requests/s, burst 30) and
kube-scheduler's (its finalizer on the claim, the claim's allocation and
the binding: 50, burst 100).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from bench import dra
from tests.apiserver.helpers import create_namespace, wait_for_service_account
from tests.conftest import stop_server
from tests.controlplane import build, scheduling
from tests.controlplane.install import Installed, api_client, install, render_manifests
from tests.controlplane.scheduling import SchedulingPlane
from webhook.decision.policy import parse_policy_text

NODES, QUICK_NODES = 100, 20
GPUS, GPU_GIB = 8, 16
NAMESPACE = "bench-scheduler"
HOOK = "gpushare-webhook"  # the MutatingWebhookConfiguration of the manifests
STATUS = "gpushare-webhook.io/status"  # the annotation the webhook writes on a pod it set up
SIZES = (1, 2, 4, 1, 3, 2, 1, 4)  # GiB: a mix, about 2.25 on average
# (key, creators, seconds from one create to the next of a creator at least, share of the pods
# of a round): as fast as the pods run, and one creator paced below the extender's binding rate.
LEVELS = (("1", 1, 0.0, 0.5), ("8", 8, 0.0, 1.0), ("1_paced", 1, 0.6, 0.25))
GOAL = 0.10  # the webhook's share of create-to-bound p50 at 8 creators
# DRA: as fast as the pods run, from 1 and 8 creators, with more pods a round than the extender
# (as many with --quick).
DRA_LEVELS = (("1", 1, 0.0, 0.5), ("8", 8, 0.0, 1.0))
DRA_POD_FACTOR = 2
GOAL_RATIO = 20.0  # DRA's pods bound a second over the extender's, at 8 creators
# Who makes the templates the webhook's pods name: the bench, in the namespace, before DRA's
# rounds (so no pod waits for one to be made).
TEMPLATES = "made before the rounds"

Make = Callable[[str, int], bytes]  # (pod name, GiB) -> the pod to create


@dataclass(frozen=True)
class Side:
    """One way GPU pods are placed: the pod created with the webhook registered and without,
    and whether the GPUs of the pods deleted are free again."""

    label: str  # in the pods' names
    holder: str  # what holds the GPUs, for a message
    with_webhook: Make
    without_webhook: Make
    settled: Callable[[], bool]


POD_TIMEOUT = 120.0


def _shipped_policy() -> str:
    """The shipped policy (the manifests' ConfigMap): default-scheduler, as the install guide."""
    for document in yaml.safe_load_all(render_manifests()):
        if (
            document
            and document.get("kind") == "ConfigMap"
            and "policy.yaml" in document.get("data", {})
        ):
            return str(document["data"]["policy.yaml"])
    raise RuntimeError("the manifests hold no policy ConfigMap")


def _pod(name: str, gib: int) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                        "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
    ).encode()


class Api:
    """Plain HTTPS to the API server as the admin, one connection per call."""

    def __init__(self, plane: SchedulingPlane) -> None:
        self.plane = plane
        self.context = plane.context()

    def connection(self, timeout: float = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.plane.port, context=self.context, timeout=timeout
        )

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = self.connection()
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return response.status, json.loads(raw) if raw else None


class Hook:
    """The webhook's MutatingWebhookConfiguration, removed and put back as it was."""

    def __init__(self, api: Api) -> None:
        self.api = api
        path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{HOOK}"
        status, stored = api.call("GET", path)
        if status != 200:
            raise RuntimeError(f"no MutatingWebhookConfiguration {HOOK}: HTTP {status}")
        metadata = stored["metadata"]
        stored["metadata"] = {
            key: metadata[key] for key in ("name", "labels", "annotations") if key in metadata
        }
        self.body = stored
        self.registered = True
        self.probes = 0

    def set(self, registered: bool) -> None:
        if registered != self.registered:
            collection = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
            if registered:
                status, answer = self.api.call("POST", collection, self.body)
                ok = status == 201
            else:
                status, answer = self.api.call("DELETE", f"{collection}/{HOOK}")
                ok = status == 200
            if not ok:
                raise RuntimeError(f"webhook configuration change: HTTP {status}: {answer}")
            self.registered = registered
        # The API server reads webhook configurations through an informer: wait until a
        # dry-run create is (or is not) mutated.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.probes += 1
            status, pod = self.api.call(
                "POST",
                f"/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All",
                json.loads(_pod(f"probe-{self.probes}", 1)),
            )
            if status == 201 and _mutated(pod) == registered:
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"the API server did not see the webhook {'added' if registered else 'removed'}"
        )


def _mutated(pod: dict[str, Any]) -> bool:
    return STATUS in (pod.get("metadata", {}).get("annotations") or {})


class Watch:
    """One watch on the namespace's pods, stamping when each is bound and Running."""

    def __init__(self, api: Api) -> None:
        status, listed = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")
        if status != 200:
            raise RuntimeError(f"cannot list pods: HTTP {status}")
        self.lock = threading.Condition()
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.mutated: dict[str, bool] = {}
        self.present: set[str] = set()
        self.failure: str | None = None
        self.closing = False
        self.conn = api.connection(timeout=3600)
        self.conn.request(
            "GET",
            f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&timeoutSeconds=3000"
            f"&resourceVersion={listed['metadata']['resourceVersion']}",
        )
        self.response = self.conn.getresponse()
        if self.response.status != 200:
            raise RuntimeError(f"cannot watch pods: HTTP {self.response.status}")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                line = self.response.readline()
                now = time.perf_counter()
                if not line:
                    raise RuntimeError("the pod watch ended")
                event = json.loads(line)
                pod = event["object"]
                if event["type"] == "ERROR":
                    raise RuntimeError(f"the pod watch failed: {pod.get('message')}")
                name = pod["metadata"]["name"]
                with self.lock:
                    if event["type"] == "DELETED":
                        self.present.discard(name)
                    else:
                        self.present.add(name)
                        self.mutated.setdefault(name, _mutated(pod))
                        if pod["spec"].get("nodeName"):
                            self.bound.setdefault(name, now)
                        if pod.get("status", {}).get("phase") == "Running":
                            self.running.setdefault(name, now)
                    self.lock.notify_all()
        except Exception as error:  # said by wait(), unless closing
            with self.lock:
                if not self.closing:
                    self.failure = f"the pod watch: {error!r}"
                self.lock.notify_all()

    def wait(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.lock:
            while not done():
                if self.failure:
                    raise RuntimeError(self.failure)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
                self.lock.wait(min(left, 1.0))

    def close(self) -> None:
        with self.lock:
            self.closing = True
        with contextlib.suppress(OSError):
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)  # ends the reader's readline
        self.conn.close()


def _create(
    api: Api, watch: Watch, names: list[str], creators: int, pace: float, *, make: Make
) -> dict[str, dict[str, float]]:
    """Create the pods from ``creators`` threads, each creating its next pod once its last one
    runs and ``pace`` seconds have passed since it sent the last; when each create was sent
    (perf_counter), and how long each create took (ms)."""
    sent: dict[str, float] = {}
    answered: dict[str, float] = {}
    lock = threading.Lock()
    queue = iter(enumerate(names))
    failures: list[str] = []

    def worker() -> None:
        conn = api.connection()
        last = 0.0
        try:
            while not failures:
                with lock:
                    index, name = next(queue, (-1, ""))
                if not name:
                    return
                body = make(name, SIZES[index % len(SIZES)])
                time.sleep(max(0.0, last + pace - time.perf_counter()))
                began = last = time.perf_counter()
                with lock:
                    sent[name] = began
                conn.request(
                    "POST",
                    f"/api/v1/namespaces/{NAMESPACE}/pods",
                    body=body,
                    headers={"Content-Type": "application/json"},
                )
                response = conn.getresponse()
                answer = response.read()
                answered[name] = (time.perf_counter() - began) * 1000
                if response.status != 201:
                    failures.append(f"HTTP {response.status}: {answer[:200]!r}")
                    return
                watch.wait(lambda n=name: n in watch.running, POD_TIMEOUT, f"pod {name} to run")
        except (OSError, RuntimeError, http.client.HTTPException) as error:
            failures.append(str(error))
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(creators)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} pods failed, first: {failures[0]}")
    return {"sent": sent, "create": answered}


def _used_gib(plane: SchedulingPlane) -> int:
    return sum(int(node.get("usedGPU") or 0) for node in plane.inspect()["nodes"])


def _clear(api: Api, watch: Watch, side: Side) -> None:
    """Delete every pod of the namespace; back when the watch sees none and what held their
    GPUs holds none (the extender's view, or the pods' claims)."""
    status, answer = api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?gracePeriodSeconds=0")
    if status != 200:
        raise RuntimeError(f"cannot delete the pods: HTTP {status}: {answer}")
    watch.wait(lambda: not watch.present, 60, "the pods to be deleted")
    deadline = time.monotonic() + 60
    while not side.settled():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side.holder} still holds GPUs after the pods were deleted")
        time.sleep(0.1)


def _round(
    api: Api,
    plane: SchedulingPlane,
    watch: Watch,
    names: list[str],
    *,
    creators: int,
    pace: float,
    registered: bool,
    side: Side,
) -> dict[str, Any]:
    make = side.with_webhook if registered else side.without_webhook
    try:
        created = _create(api, watch, names, creators, pace, make=make)
    except RuntimeError as error:
        tail = plane.log_tail("kube-scheduler", 5)
        raise RuntimeError(f"{error}; kube-scheduler says:\n{tail}") from None
    sent = created["sent"]
    with watch.lock:
        wrong = [name for name in names if watch.mutated[name] != registered]
        bound = [(watch.bound[name] - sent[name]) * 1000 for name in names]
        running = [(watch.running[name] - sent[name]) * 1000 for name in names]
        last = max(watch.bound[name] for name in names)
    if wrong:
        state = "not mutated" if registered else "mutated"
        raise RuntimeError(f"{len(wrong)} pods {state}, first {wrong[0]}")
    _clear(api, watch, side)
    return {
        "create": list(created["create"].values()),
        "bound": bound,
        "running": running,
        "pods_per_s": len(names) / (last - min(sent.values())),
    }


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _put_nodes(core: client.CoreV1Api, count: int) -> list[str]:
    """``count`` fake GPU nodes, made at once, each labelled as its node agent would; then
    waited for (Ready, untainted). Their names."""
    names = [f"gpu-{number:03d}" for number in range(count)]
    for name in names:
        scheduling.put_gpu_node(
            core.api_client,
            name,
            gpus=GPUS,
            memory=GPU_GIB,
            labels=scheduling.SHIM_LABELS,  # the shipped policy asks for the agent's label
            wait=False,
        )
    deadline = time.monotonic() + 120
    while True:
        ready = 0
        for node in core.list_node().items:
            conditions = node.status.conditions or []
            taints = node.spec.taints or []
            if any(c.type == "Ready" and c.status == "True" for c in conditions) and not any(
                t.key.startswith("node.kubernetes.io/") for t in taints
            ):
                ready += 1
        if ready >= count:
            return names
        if time.monotonic() > deadline:
            raise RuntimeError(f"{ready} of {count} fake nodes ready after 120 s")
        time.sleep(0.5)


def _cpu_ticks() -> tuple[dict[int, tuple[int, int]], int]:
    """Each process's (parent, CPU ticks used), and the ticks the machine's CPUs were busy."""
    found: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        found[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    times = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return found, sum(times) - times[3] - times[4]  # less idle and iowait


class Cpu:
    """CPU time of the processes of the run (each with its children, the bench alone: they
    are all its children) and of the machine."""

    def __init__(self, roots: Callable[[], dict[str, int]]) -> None:
        self.roots = roots
        self.tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> tuple[float, dict[str, float], float]:
        """(when, CPU seconds of each root with its descendants, busy CPU seconds in all)."""
        processes, busy = _cpu_ticks()
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in processes.items():
            children.setdefault(parent, []).append(pid)
        used: dict[str, float] = {}
        for name, root in self.roots().items():
            ticks, todo = 0, [root]
            while todo:
                pid = todo.pop()
                ticks += processes.get(pid, (0, 0))[1]
                if pid != os.getpid():
                    todo.extend(children.get(pid, ()))
            used[name] = ticks / self.tick
        return time.monotonic(), used, busy / self.tick

    def figures(
        self, used: dict[bool, dict[str, float]], seconds: float, busy: float, pods: dict[bool, int]
    ) -> dict[str, Any]:
        """CPU ms per pod of each process, with the webhook and without (``used``: CPU seconds
        of each), and the machine's busy share over ``seconds``: all of it and the run's own."""
        cpus = os.cpu_count() or 1
        row: dict[str, Any] = {}
        for registered, suffix in ((True, ""), (False, "_without")):
            row[f"cpu_ms_per_pod{suffix}"] = {
                name: round(spent * 1000 / pods[registered], 1)
                for name, spent in used[registered].items()
            }
        total = sum(sum(side.values()) for side in used.values())
        row["machine_busy_share"] = round(busy / (seconds * cpus), 3)
        row["run_busy_share"] = round(total / (seconds * cpus), 3)
        row["load_average"] = round(os.getloadavg()[0], 2)
        return row


class Rounds:
    """Rounds of pods on one side, with the webhook registered and without, alternated."""

    def __init__(
        self, api: Api, plane: SchedulingPlane, watch: Watch, hook: Hook, cpu: Cpu
    ) -> None:
        self.api, self.plane, self.watch, self.hook, self.cpu = api, plane, watch, hook, cpu
        self.serial = 0

    def names(self, count: int, label: str) -> list[str]:
        self.serial += 1
        return [f"{label}-{self.serial}-{i}" for i in range(count)]

    def one(
        self, side: Side, pods: list[str], *, creators: int, pace: float, registered: bool
    ) -> dict[str, Any]:
        self.hook.set(registered)
        return _round(
            *(self.api, self.plane, self.watch, pods),
            creators=creators,
            pace=pace,
            registered=registered,
            side=side,
        )

    def warm(self, side: Side) -> None:
        """Every path once, with and without the webhook."""
        for registered in (True, False):
            pods = self.names(8, f"warm-{side.label}")
            self.one(side, pods, creators=4, pace=0, registered=registered)

    def levels(
        self, side: Side, levels: tuple[tuple[str, int, float, float], ...], rounds: int, size: int
    ) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for key, creators, pace, share in levels:
            found: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
            used: dict[bool, dict[str, float]] = {True: {}, False: {}}
            seconds = busy = 0.0
            for number in range(rounds):
                # ABBA: neither side always goes first.
                for registered in (True, False) if number % 2 == 0 else (False, True):
                    way = "with" if registered else "without"
                    pods = self.names(
                        round(size * share), f"{side.label}-c{key.replace('_', '-')}-{way}"
                    )
                    before = self.cpu.sample()
                    found[registered].append(
                        self.one(side, pods, creators=creators, pace=pace, registered=registered)
                    )
                    after = self.cpu.sample()
                    seconds, busy = seconds + after[0] - before[0], busy + after[2] - before[2]
                    for name, total in after[1].items():
                        spent = total - before[1].get(name, 0.0)
                        used[registered][name] = used[registered].get(name, 0.0) + spent
            counts = {r: sum(len(one["bound"]) for one in found[r]) for r in found}
            results[key] = {**_figures(found), **self.cpu.figures(used, seconds, busy, counts)}
        return results


def run(quick: bool) -> dict[str, Any]:
    binaries = build.ensure()
    programs = scheduling.ensure()
    rounds, per_round = (2, 24) if quick else (4, 60)
    nodes = QUICK_NODES if quick else NODES
    root = Path(tempfile.mkdtemp(prefix="gpushare-bench-scheduler-"))
    results: dict[str, Any] = {}
    began = time.monotonic()
    with scheduling.running(
        root / "cluster", binaries, programs, configuration="install-guide"
    ) as plane:
        shipped = _shipped_policy()
        installed = install(plane, root / "webhook", workers=None, policy=shipped)
        watch: Watch | None = None
        try:
            admin = api_client(plane.kubeconfig)
            dra.publish(admin, _put_nodes(client.CoreV1Api(admin), nodes), GPUS, GPU_GIB)
            create_namespace(admin, NAMESPACE)
            wait_for_service_account(admin, NAMESPACE)
            api = Api(plane)
            watch = Watch(api)
            cpu = Cpu(
                lambda: {
                    **{name: proc.pid for name, proc in plane.processes.items()},
                    "webhook": installed.server.process.pid,
                    "bench": os.getpid(),
                }
            )
            bench = Rounds(api, plane, watch, Hook(api), cpu)
            extender = Side("ext", "the extender", _pod, _pod, lambda: not _used_gib(plane))
            bench.warm(extender)
            results["setup_s"] = round(time.monotonic() - began, 1)
            results.update(bench.levels(extender, LEVELS, rounds, per_round))
            size = per_round if quick else per_round * DRA_POD_FACTOR
            results["dra"] = _dra(installed, bench, shipped, rounds, size)
            if _ratios(results, "dra")["8"]["with"] < GOAL_RATIO:
                plane.set_client_limits(dra.RAISED_LIMITS)
                raised = _dra(installed, bench, None, rounds, size)
                results["dra_raised_limits"] = raised
            for name in ("dra", "dra_raised_limits"):
                if name in results:
                    results[name]["ratio_to_extender"] = _ratios(results, name)
            results["nodes"] = nodes
            results["gpus_per_node"] = GPUS
            results["gib_per_gpu"] = GPU_GIB
            results["configuration"] = plane.configuration
            results["goal_share_at_8"] = GOAL
            results["goal_ratio_at_8"] = GOAL_RATIO
        finally:
            if watch is not None:
                watch.close()
            stop_server(installed.server)
    return results


def _dra(
    installed: Installed, bench: Rounds, shipped: str | None, rounds: int, size: int
) -> dict[str, Any]:
    """DRA's rounds: the webhook first switched to ``scheduler: dra`` (unless ``shipped`` is
    None: it already is) and the templates made."""
    if shipped is not None:
        installed.set_policy(dra.policy_text(shipped))
    policy = parse_policy_text(
        Path(installed.args[installed.args.index("--policy") + 1]).read_text()
    )
    api = bench.api
    dra.make_templates(api.call, NAMESPACE, SIZES, policy)
    side = Side(
        "dra",
        "the pods' ResourceClaims",
        _pod,
        dra.hand_written_pod,
        lambda: not dra.claims_left(api.call, NAMESPACE),
    )
    bench.warm(side)
    found = bench.levels(side, DRA_LEVELS, rounds, size)
    limits = bench.plane.client_limits
    found["client_limits"] = {"qps": limits[0], "burst": limits[1]} if limits else "defaults"
    found["templates"] = TEMPLATES
    return found


def _ratios(results: dict[str, Any], name: str) -> dict[str, dict[str, float]]:
    """DRA's pods/s over the extender's, with the webhook and without, at each level."""
    ratios: dict[str, dict[str, float]] = {}
    for key, *_ in DRA_LEVELS:
        dra_row, extender_row = results[name][key], results[key]
        ratios[key] = {
            way: round(dra_row[f"pods_per_s{suffix}"] / extender_row[f"pods_per_s{suffix}"], 2)
            for way, suffix in (("with", ""), ("without", "_without"))
        }
    return ratios


def _figures(found: dict[bool, list[dict[str, Any]]]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for registered, suffix in ((True, ""), (False, "_without")):
        rounds = found[registered]
        bound = [ms for r in rounds for ms in r["bound"]]
        running = [ms for r in rounds for ms in r["running"]]
        row[f"pods{suffix}"] = len(bound)
        row[f"create_p50_ms{suffix}"] = round(
            statistics.median(ms for r in rounds for ms in r["create"]), 1
        )
        row[f"create_to_bound_p50_ms{suffix}"] = round(statistics.median(bound), 1)
        row[f"create_to_bound_p99_ms{suffix}"] = round(_percentile(bound, 0.99), 1)
        row[f"create_to_running_p50_ms{suffix}"] = round(statistics.median(running), 1)
        row[f"create_to_running_p99_ms{suffix}"] = round(_percentile(running, 0.99), 1)
        row[f"pods_per_s{suffix}"] = round(statistics.median(r["pods_per_s"] for r in rounds), 2)
    with_p50, without_p50 = row["create_to_bound_p50_ms"], row["create_to_bound_p50_ms_without"]
    row["webhook_share_of_bound_p50"] = round((with_p50 - without_p50) / with_p50, 4)
    # The same share from each pair of rounds run back to back, then their median.
    pairs = [
        (statistics.median(w["bound"]) - statistics.median(n["bound"]))
        / statistics.median(w["bound"])
        for w, n in zip(found[True], found[False], strict=True)
    ]
    row["webhook_share_of_bound_p50_paired"] = round(statistics.median(pairs), 4)
    return row


def _row(who: str, row: dict[str, Any]) -> str:
    return (
        f"  {who}: {row['pods']}/{row['pods_without']} "
        f"pods, {row['pods_per_s']:.1f}/{row['pods_per_s_without']:.1f} pods/s; "
        f"create to bound p50 {row['create_to_bound_p50_ms']:.0f}/"
        f"{row['create_to_bound_p50_ms_without']:.0f} ms, p99 "
        f"{row['create_to_bound_p99_ms']:.0f}/{row['create_to_bound_p99_ms_without']:.0f} ms; "
        f"to Running p50 {row['create_to_running_p50_ms']:.0f}/"
        f"{row['create_to_running_p50_ms_without']:.0f} ms; webhook's share of bound p50 "
        f"{row['webhook_share_of_bound_p50']:+.1%} (paired rounds "
        f"{row['webhook_share_of_bound_p50_paired']:+.1%})"
    )


def _cpu_line(row: dict[str, Any]) -> str:
    spent, without = row["cpu_ms_per_pod"], row["cpu_ms_per_pod_without"]
    names = sorted(spent, key=lambda name: -spent[name])
    return (
        "    CPU ms a pod, with the webhook/without: "
        + ", ".join(
            f"{name} {spent[name]:.0f}/{without.get(name, 0):.0f}"
            for name in names
            if spent[name] >= 0.5
        )
        + f"; all {sum(spent.values()):.0f}/{sum(without.values()):.0f}; the machine's CPUs "
        f"{row['machine_busy_share']:.0%} busy, this run's processes "
        f"{row['run_busy_share']:.0%}; load {row['load_average']:.1f}"
    )


def _who(creators: int, pace: float) -> str:
    who = f"{creators} creator{'s' if creators > 1 else ''}"
    return who + (f", paced {pace:.1f} s" if pace else "")


def report(results: dict[str, Any]) -> None:
    print(
        f"\nthrough kube-scheduler + the extender ({results['configuration']}), "
        f"{results['nodes']} KWOK nodes of {results['gpus_per_node']} GPUs x "
        f"{results['gib_per_gpu']} GiB: with the webhook / without"
    )
    for key, creators, pace, _ in LEVELS:
        print(_row(_who(creators, pace), results[key]))
        print(_cpu_line(results[key]))
    share = results["8"]["webhook_share_of_bound_p50"]
    goal = results["goal_share_at_8"]
    print(
        f"goal: the webhook adds at most {goal:.0%} to create-to-bound p50 at 8 creators: "
        f"{share:+.1%}, {'met' if share <= goal else 'not met'} (the pods wait for the "
        "extender's client there)"
    )
    paced = results["1_paced"]
    added = paced["create_to_bound_p50_ms"] - paced["create_to_bound_p50_ms_without"]
    print(
        f"unqueued (1 creator, paced): the webhook adds {added:.0f} ms to create-to-bound p50 "
        f"({paced['webhook_share_of_bound_p50']:+.1%}); the create call itself "
        f"{paced['create_p50_ms']:.1f} vs {paced['create_p50_ms_without']:.1f} ms"
    )
    for name in ("dra", "dra_raised_limits"):
        if name in results:
            _report_dra(results, name)


def _report_dra(results: dict[str, Any], name: str) -> None:
    found = results[name]
    limits = found["client_limits"]
    said = (
        f"qps {limits['qps']:g}, burst {limits['burst']}"
        if isinstance(limits, dict)
        else "their defaults"
    )
    print(
        f"\nthrough kube-scheduler's DRA (ResourceSlices on the same nodes; the clients of "
        f"kube-controller-manager and kube-scheduler at {said}; templates {found['templates']}): "
        "with the webhook / by hand"
    )
    for key, creators, pace, _ in DRA_LEVELS:
        ratio = found["ratio_to_extender"][key]
        print(
            _row(_who(creators, pace), found[key])
            + f"; pods/s x{ratio['with']:.1f}/x{ratio['without']:.1f} the extender's"
        )
        print(_cpu_line(found[key]))
    ratio = found["ratio_to_extender"]["8"]["with"]
    share = found["8"]["webhook_share_of_bound_p50"]
    goal_ratio, goal_share = results["goal_ratio_at_8"], results["goal_share_at_8"]
    print(
        f"goals at 8 creators: DRA places x{ratio:.1f} the extender's pods/s (at least "
        f"x{goal_ratio:.0f}: {'met' if ratio >= goal_ratio else 'not met'}); the webhook adds "
        f"{share:+.1%} to DRA's create-to-bound p50 (at most {goal_share:.0%}: "
        f"{'met' if share <= goal_share else 'not met'})"
    )
