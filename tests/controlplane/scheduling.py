"""The scheduling tier: the control plane with kube-scheduler, KWOK's fake nodes and the extender.

kube-scheduler (built with the control plane) calls the GPU Share Scheduler
Extender (tests/controlplane/extender.py) for every pod that asks for
``aliyun.com/gpu-mem``, configured as the extender's own ``config/`` and
``docs/install.md`` do, in the ``kubescheduler.config.k8s.io/v1`` form:
the extender filters the nodes and binds the pod, writing its
``ALIYUN_COM_GPU_MEM_*`` annotations. KWOK (tests/gotools/kwok) plays the
kubelets of the nodes annotated ``kwok.x-k8s.io/node: fake``: it makes
them Ready, renews their leases and runs the pods bound to them, through
the stages it ships (node-initialize, node-heartbeat-with-lease, pod-ready,
pod-complete, pod-delete; kwok itself applies none without a config, only
kwokctl does). No container runs anywhere.

Two scheduler configurations, both as the extender's guide writes the
``extenders`` entry: ``install-guide`` (no profiles: the default profile,
``default-scheduler``) and ``profiles`` (``default-scheduler`` and
``gpushare-scheduler``; an extender applies to every profile).
``SchedulingPlane.use`` restarts kube-scheduler with the other one. A
third, ``no-extender`` (the default profile and no extender), is not among
the ones every test runs in: a test names it where kube-scheduler must
serve ``aliyun.com/gpu-mem`` on its own, through a DeviceClass that maps
it (KEP-5004, tests/controlplane/dra.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests import gotools
from tests.conftest import free_port
from tests.controlplane import extender
from tests.controlplane.build import Binaries
from tests.controlplane.cluster import ControlPlane, ControlPlaneError
from tests.controlplane.install import api_client
from tests.helpers import GPU, eventually

GPU_COUNT = "aliyun.com/gpu-count"
FAKE = ("kwok.x-k8s.io/node", "fake")  # the annotation of the nodes KWOK plays the kubelet of
CONFIGURATIONS = ("install-guide", "profiles")
NO_EXTENDER = "no-extender"  # named by the tests that need it, not run by every test
GPUSHARE_SCHEDULER = "gpushare-scheduler"
EXTENDER = extender.NAME
ANNOTATIONS = (
    "ALIYUN_COM_GPU_MEM_IDX",
    "ALIYUN_COM_GPU_MEM_POD",
    "ALIYUN_COM_GPU_MEM_DEV",
    "ALIYUN_COM_GPU_MEM_ASSIGNED",
    "ALIYUN_COM_GPU_MEM_ASSUME_TIME",
)
_STAGES = [
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
]


@dataclass(frozen=True)
class Programs:
    """What the tier runs besides the control plane."""

    kwok: Path
    stages: list[Path]  # KWOK's shipped stages, from its module in Go's module cache
    extender: Path
    build_seconds: dict[str, float]  # of the builds that filled the caches; 0 when there


def ensure(*, say: bool = True) -> Programs:
    """KWOK and the extender, built first where the caches lack them; Unavailable if they cannot
    be (no Go, no extender source, a failing build)."""
    module, package = gotools.TOOLS["kwok"]
    folder, kwok_seconds = gotools.build(
        module,
        {"kwok": package},
        cache=gotools.cache_base("GPUSHARE_GOTOOLS_CACHE", "gotools"),
        label="kwok",
        say="building kwok from its Go module (the first time only, a few minutes)" if say else "",
    )
    stages = gotools.module_files(module, {"sigs.k8s.io/kwok": _STAGES})
    path, extender_seconds = extender.ensure(say=say)
    return Programs(
        kwok=folder / "kwok",
        stages=stages,
        extender=path,
        build_seconds={"kwok": kwok_seconds, EXTENDER: extender_seconds},
    )


def scheduler_configuration(name: str, *, kubeconfig: Path, extender_url: str) -> dict[str, Any]:
    """The KubeSchedulerConfiguration ``name`` (of CONFIGURATIONS, or NO_EXTENDER)."""
    known = (*CONFIGURATIONS, NO_EXTENDER)
    if name not in known:
        raise ValueError(f"no scheduler configuration {name!r}: one of {', '.join(known)}")
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
    }
    if name == NO_EXTENDER:
        return config
    # As the extender's config/scheduler-policy-config.yaml writes it.
    config["extenders"] = [
        {
            "urlPrefix": extender_url,
            "filterVerb": "filter",
            "bindVerb": "bind",
            "enableHTTPS": False,
            "nodeCacheCapable": True,
            "managedResources": [{"name": GPU, "ignoredByScheduler": False}],
            "ignorable": False,
        }
    ]
    if name == "profiles":
        config["profiles"] = [
            {"schedulerName": "default-scheduler"},
            {"schedulerName": GPUSHARE_SCHEDULER},
        ]
    return config


class SchedulingPlane(ControlPlane):
    """A ControlPlane that also runs the extender, KWOK and kube-scheduler (in that order)."""

    def __init__(
        self,
        root: Path,
        binaries: Binaries,
        programs: Programs,
        *,
        configuration: str = "install-guide",
    ) -> None:
        super().__init__(root, binaries)
        self.programs = programs
        self.configuration = configuration
        self.extender_port = free_port()
        self.extender_url = f"http://127.0.0.1:{self.extender_port}"
        self.client_limits: tuple[float, int] | None = None  # (qps, burst); None: the defaults

    def start(self) -> None:
        try:
            super().start()
            self.start_extender()
            self.start_kwok()
            self.start_scheduler(self.write_configuration(self.configuration))
        except BaseException:
            self.stop()
            raise

    def write_configuration(self, name: str) -> Path:
        config = scheduler_configuration(
            name,
            kubeconfig=self.kubeconfig,
            extender_url=f"{self.extender_url}/gpushare-scheduler",
        )
        if self.client_limits:
            qps, burst = self.client_limits
            config["clientConnection"].update({"qps": qps, "burst": burst})
        path = self.root / f"scheduler-{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def use(self, configuration: str) -> None:
        """Run kube-scheduler with ``configuration`` (of CONFIGURATIONS, or NO_EXTENDER);
        restarts it if needed."""
        if configuration == self.configuration and "kube-scheduler" in self.processes:
            return
        path = self.write_configuration(configuration)
        self.stop_process("kube-scheduler")
        self.configuration = configuration
        self.start_scheduler(path)

    def set_client_limits(self, limits: tuple[float, int] | None) -> None:
        """Restart kube-controller-manager and kube-scheduler with their clients allowed
        ``limits`` (qps, burst) requests a second; None: their defaults (20/30 and 50/100)."""
        self.client_limits = limits
        self.stop_process("kube-controller-manager")
        self.start_controller_manager(client_limits=limits)
        self.stop_process("kube-scheduler")
        self.start_scheduler(self.write_configuration(self.configuration))

    def start_extender(self) -> None:
        self._spawn(
            EXTENDER,
            [str(self.programs.extender)],
            env={"KUBECONFIG": str(self.kubeconfig), "PORT": str(self.extender_port)},
        )
        # It listens once its node cache is built.
        self._wait(EXTENDER, lambda: self._get(f"{self.extender_url}/version") is not None)

    def start_kwok(self) -> None:
        self._spawn(
            "kwok",
            [
                str(self.programs.kwok),
                f"--kubeconfig={self.kubeconfig}",
                *(f"--config={stage}" for stage in self.programs.stages),
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE[0]}={FAKE[1]}",
                "--node-lease-duration-seconds=40",  # as kwokctl runs it
            ],
            # Its default config, ~/.kwok/kwok.yaml, would be read first where it exists.
            env={"HOME": str(self.root)},
        )
        # Ready when it plays a node: one made, seen Ready, and deleted.
        core = client.CoreV1Api(api_client(self.kubeconfig))
        probe = "kwok-probe"
        put_gpu_node(core.api_client, probe, gpus=0, wait=False)
        try:
            self._wait("kwok", lambda: node_ready(core.api_client, probe), timeout=60)
        finally:
            with contextlib.suppress(ApiException):
                core.delete_node(probe)

    def inspect(self, node: str | None = None) -> dict[str, Any]:
        """The extender's view of the GPUs: ``{"nodes": [{"name", "totalGPU", "usedGPU",
        "devs": [{"id", "totalGPU", "usedGPU", "pods": [{"name", "namespace", "usedGPU"}]}]}]}``
        (of one node when named)."""
        url = f"{self.extender_url}/gpushare-scheduler/inspect" + (f"/{node}" if node else "")
        body = self._get(url)
        if body is None:
            tail = self.log_tail(EXTENDER)
            raise ControlPlaneError(f"the extender did not answer {url}:\n{tail}")
        found: dict[str, Any] = json.loads(body)
        return found

    def _get(self, url: str) -> bytes | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                data: bytes = response.read()
                return data
        except (OSError, urllib.error.URLError):
            return None


# What the node agent sets on a node where it installed the shim (docs/node-agent.md).
SHIM_LABELS = {"gpushare-webhook.io/shim": "0123456789ab"}


def put_gpu_node(
    api: client.ApiClient,
    name: str,
    *,
    gpus: int = 4,
    memory: int = 16,
    labels: dict[str, str] | None = None,
    gpu_count: bool = True,
    cpu: str = "32",
    ram: str = "256Gi",
    wait: bool = True,
) -> dict[str, Any]:
    """A fake node that KWOK plays, reporting ``gpus`` GPUs of ``memory`` GiB as the gpushare
    device plugin does (``aliyun.com/gpu-mem`` the node's total GiB, ``aliyun.com/gpu-count``
    unless ``gpu_count`` is false; neither when ``gpus`` is 0); waits until it is Ready and
    schedulable unless told not to. The node as stored."""
    core = client.CoreV1Api(api)
    capacity = {"cpu": cpu, "memory": ram, "pods": "110"}
    if gpus:
        capacity[GPU] = str(gpus * memory)
        if gpu_count:
            capacity[GPU_COUNT] = str(gpus)
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE[0]: FAKE[1]},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
        },
        # A create keeps the status (a kubelet registers its node so).
        "status": {"capacity": capacity, "allocatable": capacity},
    }
    core.create_node(body)
    if wait:
        eventually(lambda: node_ready(api, name, schedulable=True), timeout=60)
    raw = core.read_node(name, _preload_content=False)
    stored: dict[str, Any] = json.loads(raw.data)
    return stored


def node_ready(api: client.ApiClient, name: str, *, schedulable: bool = False) -> bool:
    """The node's Ready condition is True (and, if ``schedulable``, the node lifecycle
    controller has lifted its ``not-ready`` taint)."""
    try:
        node = client.CoreV1Api(api).read_node(name)
    except ApiException:
        return False
    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    if not ready or not schedulable:
        return ready
    return not any(t.key.startswith("node.kubernetes.io/") for t in (node.spec.taints or []))


def delete_fake_nodes(api: client.ApiClient) -> None:
    """Delete every fake node and wait until they are gone."""
    core = client.CoreV1Api(api)

    def fakes() -> list[str]:
        return [
            node.metadata.name
            for node in core.list_node().items
            if (node.metadata.annotations or {}).get(FAKE[0]) == FAKE[1]
        ]

    for name in fakes():
        with contextlib.suppress(ApiException):
            core.delete_node(name)
    eventually(lambda: not fakes(), timeout=30)


@contextlib.contextmanager
def running(
    root: Path, binaries: Binaries, programs: Programs, *, configuration: str = "install-guide"
) -> Iterator[SchedulingPlane]:
    plane = SchedulingPlane(root, binaries, programs, configuration=configuration)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


if __name__ == "__main__":
    try:
        built = ensure()
    except gotools.Unavailable as error:
        sys.exit(f"scheduling tier: {error}")
    print(built.kwok, built.extender, sep="\n")
