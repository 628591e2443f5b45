"""``python3 -m tests.controlplane``: the control plane of the tests, the webhook in it, by hand.

Starts etcd, kube-apiserver and kube-controller-manager on loopback
(building them first if the cache lacks them), installs the webhook from
the manifests as the tests do, prints the kubeconfig to use with kubectl,
and stops everything on Ctrl-C. With ``--scheduler`` it adds the scheduling
tier (tests/controlplane/scheduling.py: kube-scheduler, the GPU share
scheduler extender built from ``GPUSHARE_EXTENDER_SOURCE``, KWOK) and
fake GPU nodes, so that pods are bound and run.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import threading
from pathlib import Path

from tests.conftest import stop_server
from tests.controlplane import build, scheduling
from tests.controlplane.cluster import ControlPlane, ControlPlaneError, running
from tests.controlplane.install import api_client, install


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.controlplane", description=__doc__)
    parser.add_argument(
        "--dir", help="where to keep logs and credentials (default: a new temp dir)"
    )
    parser.add_argument(
        "--scheduler",
        nargs="?",
        const="profiles",
        choices=scheduling.CONFIGURATIONS,
        help="also run kube-scheduler with the extender (in this configuration, default "
        "profiles: the shipped policy sends GPU pods to gpushare-scheduler) and KWOK",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=2,
        help="with --scheduler: how many fake nodes of 4 GPUs x 16 GiB to make (default 2)",
    )
    options = parser.parse_args()
    root = Path(options.dir or tempfile.mkdtemp(prefix="gpushare-controlplane-"))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"control plane: --dir {root}: {error.strerror}", file=sys.stderr)
        return 2
    try:
        binaries = build.ensure()
        programs = scheduling.ensure() if options.scheduler else None
    except build.Unavailable as error:
        print(f"control plane: {error}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = root / "cluster"
    starting: contextlib.AbstractContextManager[ControlPlane] = (
        scheduling.running(cluster, binaries, programs, configuration=options.scheduler)
        if programs
        else running(cluster, binaries)
    )
    try:
        with starting as plane:
            installed = install(plane, root / "webhook")
            try:
                if isinstance(plane, scheduling.SchedulingPlane):
                    api = api_client(plane.kubeconfig)
                    for number in range(1, options.nodes + 1):
                        # Labelled as the node agent would: the shipped policy asks for it.
                        scheduling.put_gpu_node(
                            api, f"gpu-{number}", gpus=4, memory=16, labels=scheduling.SHIM_LABELS
                        )
                    print(
                        f"kube-scheduler ({options.scheduler}) calls the extender at "
                        f"{plane.extender_url}; {options.nodes} fake nodes of 4 GPUs x 16 GiB "
                        f"(KWOK): curl {plane.extender_url}/gpushare-scheduler/inspect",
                        flush=True,
                    )
                print(
                    f"control plane at {plane.url}, the webhook at "
                    f"https://127.0.0.1:{installed.server.port}/mutate\n"
                    f"  export KUBECONFIG={plane.kubeconfig}\n"
                    "  kubectl run train --image=pytorch "
                    '--overrides=\'{"spec":{"containers":[{"name":"train","image":"pytorch",'
                    '"resources":{"limits":{"aliyun.com/gpu-mem":"4"}}}]}}\'\n'
                    "  kubectl get pod train -o yaml\n"
                    f"logs: {root} (webhook/webhook.log, cluster/*.log); Ctrl-C stops everything",
                    flush=True,
                )
                stop.wait()
            finally:
                stop_server(installed.server)
    except KeyboardInterrupt:
        pass
    except (ControlPlaneError, RuntimeError, OSError, AssertionError) as error:
        print(f"control plane: {str(error).splitlines()[0]} (logs in {root})", file=sys.stderr)
        return 1
    print("stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
