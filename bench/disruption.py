"""What an operator's week does to pod creates, drain on and off.

    python bench/run.py --disruption [--quick]

Starts the tests' control plane with the webhook installed from the
manifests, then, once with the replicas' drain on (``serve``'s default)
and once off (``--drain 0``, a server that stops accepting on SIGTERM):
two replicas behind the tests' stand-in for a Service, whose endpoint list
lags the replicas' readiness by ``LAG`` seconds (tests/apiserver/service.py;
the tier has no kube-proxy), the guard applied, and pods (half of them GPU
pods) created at ``RATE`` a second while the events of
tests/apiserver/disruption.py happen in turn, each followed by ``settle``
seconds of steady creates (20 s, 2 s with --quick: the full run creates
for over two minutes in each mode). Reports per event the creates
attempted, refused (the webhook call failed), timed out, refused by the
guard, and the longest gap between two answered creates; and the GPU pods
stored without their set-up. Not a test: it never fails on a count.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from tests.apiserver.disruption import (
    Creators,
    Replicas,
    apply_guard,
    policy_text,
    remove_guard,
    unconfined,
)
from tests.apiserver.helpers import wait_for_service_account
from tests.apiserver.service import Service
from tests.conftest import stop_server
from tests.controlplane import build
from tests.controlplane.cluster import ControlPlane, running
from tests.controlplane.install import Installed, install, point_webhook_at, write_policy
from webhook.serving.drain import DEFAULT_DRAIN

RATE = 20.0  # creates a second
LAG = 2.0  # endpoint list behind readiness: the EndpointSlice, then kube-proxy's 1 s sync
EVENTS = ("rolling update", "certificate rotation", "policy edit", "guard upgrade", "SIGKILL")


def _mode(installed: Installed, folder: Path, drain: float, settle: float) -> dict[str, Any]:
    plane: ControlPlane = installed.plane
    namespace = f"bench-disruption-{'on' if drain else 'off'}"
    plane.kubectl("create", "namespace", namespace)
    wait_for_service_account(installed.api, namespace)
    shipped = policy_text(installed)
    service = Service(installed.server.ca, lag=LAG)
    replicas = Replicas(installed, service, folder, drain=drain)
    actions = {
        "rolling update": replicas.rolling_update,
        "certificate rotation": replicas.rotate,
        "policy edit": replicas.edit_policy,
        "guard upgrade": replicas.upgrade_guard,
        "SIGKILL": replicas.kill_one,
    }
    try:
        replicas.start()
        replicas.start()
        apply_guard(installed, shipped, folder)
        point_webhook_at(plane, f"https://127.0.0.1:{service.port}/mutate")
        began = time.monotonic()
        with Creators(installed, namespace, rate=RATE) as creators:
            time.sleep(settle)
            for event in EVENTS:
                creators.during(event, actions[event], max(settle, LAG + 2.0))
        seconds = time.monotonic() - began
        return {
            "drain_s": drain,
            "seconds": round(seconds, 1),
            "events": creators.summary(),
            "gpu_pods_unconfined": len(unconfined(installed, namespace)),
            "first_failure": creators.examples,
        }
    finally:
        point_webhook_at(plane, f"https://127.0.0.1:{installed.server.port}/mutate")
        remove_guard(installed)
        write_policy(plane, shipped)
        replicas.stop()
        service.close()


def run(quick: bool) -> dict[str, Any]:
    binaries = build.ensure()
    root = Path(tempfile.mkdtemp(prefix="gpushare-bench-disruption-"))
    settle = 2.0 if quick else 20.0
    results: dict[str, Any] = {"rate_per_s": RATE, "endpoint_lag_s": LAG, "settle_s": settle}
    with running(root / "cluster", binaries) as plane:
        installed = install(plane, root / "webhook", workers=None)
        try:
            for name, drain in (("drain_on", DEFAULT_DRAIN), ("drain_off", 0.0)):
                results[name] = _mode(installed, root / name, drain, settle)
        finally:
            stop_server(installed.server)
    return results


def report(results: dict[str, Any]) -> None:
    print(
        f"\ndisruption at {results['rate_per_s']:g} creates/s, endpoint list "
        f"{results['endpoint_lag_s']:g} s behind readiness"
    )
    for name in ("drain_on", "drain_off"):
        mode = results[name]
        print(
            f"  drain {mode['drain_s']:g} s ({mode['seconds']:g} s of creates; "
            f"GPU pods stored unconfined: {mode['gpu_pods_unconfined']})"
        )
        for event, row in mode["events"].items():
            gap = f", longest gap {row['longest_gap_s']:.2f} s" if "longest_gap_s" in row else ""
            print(
                f"    {event:<22} {row['attempted']:>5} creates, {row['refused']:g} refused, "
                f"{row['timed_out']:g} timed out, {row['refused_by_the_guard']:g} by the guard, "
                f"{row['failed_otherwise']:g} otherwise{gap}"
            )
        for event, message in mode["first_failure"].items():
            print(f"    first failure in {event}: {message[:200]}")
