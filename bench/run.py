"""Benchmark gpushare-webhook against a floor, on loopback, over keep-alive HTTPS.

    python bench/run.py [--quick]
    python bench/run.py --apiserver [--quick]   (through the real kube-apiserver)
    python bench/run.py --scheduler [--quick]   (create to bound: kube-scheduler, the extender)
    python bench/run.py --disruption [--quick]  (creates through updates, rotations, SIGKILL)

Starts ``gpushare-webhook serve`` as deployed (gunicorn, TLS, the project's
own certificates) and the floor (``bench/floor.py``: json.loads and a fixed
answer, same gunicorn and TLS settings), alternates trials of each at
concurrency 1, 8 and 32 with fresh keep-alive connections per trial, and
reports medians and the median ratio of back-to-back trials. Also measures
the pure decision against a json round trip (and where a review of the mix
goes: reading, deciding, writing the answer, the log line), worker RSS, and
start-up time.
Writes bench/results.json.
The load comes from wrk (a compiled generator, ``bench/wrk.lua`` for the
POST bodies) when it is on the PATH (Debian: ``apt-get install wrk``), else
from Python threads in this process; either way the client's CPU share is
reported, so a starved server is visible. Not a test: it never fails on a
timing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import resource
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.reviews import gpu_pod, mix, review  # noqa: E402
from webhook import tls  # noqa: E402
from webhook.decision.admission import admit, decide  # noqa: E402
from webhook.decision.capacity import GpuNode  # noqa: E402
from webhook.decision.decoding import decode  # noqa: E402
from webhook.decision.policy import DEFAULT_POLICY  # noqa: E402
from webhook.decision.prepared import Prepared  # noqa: E402
from webhook.serving import logs  # noqa: E402
from webhook.serving.app import log_admission  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    port: int,
    context: ssl.SSLContext,
    deadline: float,
    host: str = "localhost",
    proc: subprocess.Popen[bytes] | None = None,
) -> float:
    start = time.monotonic()
    body = review(gpu_pod(1, rng=__import__("random").Random(1)), "ready")
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            said = _said(proc)
            last = said.splitlines()[-1] if said else "no output"
            raise RuntimeError(f"server on {port} exited with {proc.returncode}: {last}")
        try:
            conn = http.client.HTTPSConnection(host, port, context=context, timeout=5)
            conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
            if conn.getresponse().status == 200:
                conn.close()
                return time.monotonic() - start
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server on {port} never answered")


def _said(proc: subprocess.Popen[bytes]) -> str:
    log = proc.stderr
    if log is None:
        return ""
    log.seek(0)
    return log.read().decode(errors="replace").strip()


def start(
    cmd: list[str], port: int, context: ssl.SSLContext, host: str = "localhost"
) -> tuple[subprocess.Popen[bytes], float]:
    began = time.monotonic()
    # stderr goes to a file, read only to say why a server never came up (a
    # pipe nobody reads would stall a server that logs every admission).
    log = tempfile.TemporaryFile()  # noqa: SIM115 (it lives as long as the server)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT)
    proc.stderr = log
    wait_ready(port, context, began + 60, host, proc)
    return proc, time.monotonic() - began


def workers_rss_mib(proc: subprocess.Popen[bytes]) -> list[float]:
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    out = []
    for pid in children.read_text().split() if children.exists() else []:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out.append(int(line.split()[1]) / 1024)
    return out


def trial(
    port: int,
    context: ssl.SSLContext,
    bodies: list[bytes],
    concurrency: int,
    requests: int,
    *,
    host: str = "localhost",
) -> dict[str, Any]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    per_thread = max(1, requests // concurrency)

    def worker(offset: int) -> None:
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=10)
        local = []
        for i in range(per_thread):
            body = bodies[(offset * per_thread + i) % len(bodies)]
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    with lock:
                        errors[0] += 1
            except (OSError, http.client.HTTPException):
                with lock:
                    errors[0] += 1
                conn.close()
                conn = http.client.HTTPSConnection(host, port, context=context, timeout=10)
            local.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            latencies.extend(local)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    cpu0, wall0 = os.times(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall0
    cpu1 = os.times()
    client_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    latencies.sort()
    return {
        "requests": len(latencies),
        "rps": len(latencies) / wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "errors": errors[0],
        "client_cpu_share": client_cpu / (wall * (os.cpu_count() or 1)),
    }


def wrk_trial(
    wrk: str, port: int, bodies_file: Path, concurrency: int, seconds: float
) -> dict[str, Any]:
    """One trial with wrk: fresh keep-alive connections, fixed duration."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.perf_counter()
    done = subprocess.run(
        [
            *(wrk, "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"),
            *("-s", str(ROOT / "bench" / "wrk.lua"), f"https://localhost:{port}"),
            *("--", str(bodies_file), "0"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - wall0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "requests": figures["requests"],
        "rps": figures["requests"] / (figures["duration_us"] / 1e6),
        "p50_ms": figures["p50_us"] / 1000,
        "p99_ms": figures["p99_us"] / 1000,
        "errors": figures["errors"],
        "client_cpu_share": cpu / (wall * (os.cpu_count() or 1)),
    }


def median_of(trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: statistics.median(t[key] for t in trials) for key in trials[0]}


def paired(webhook: list[dict[str, Any]], floor: list[dict[str, Any]]) -> dict[str, float]:
    """Median of the webhook/floor ratios of trials run back to back.

    The machine's speed drifts over minutes; two trials a few seconds apart
    see nearly the same machine, so their ratio moves less than the ratio
    of two medians taken over the whole level.
    """
    return {
        f"{key}_ratio": statistics.median(
            w[key] / f[key] for w, f in zip(webhook, floor, strict=True)
        )
        for key in ("rps", "p50_ms", "p99_ms")
    }


def _audit_lines_to(fd: int) -> None:
    """Write this process's admission log lines as ``serve`` does (JSON, one write each) to fd."""
    logs.skip_unused_record_fields()
    handler = logs.LineHandler(fd)
    handler.setFormatter(logs.JsonFormatter())
    audit = logging.getLogger("gpushare_webhook.admission")
    audit.handlers[:] = [handler]
    audit.setLevel(logging.INFO)
    audit.propagate = False


def decision_us(bodies: list[bytes], rounds: int) -> dict[str, float]:
    body = next(
        b for b in bodies if json.loads(b)["request"]["object"]["spec"]["containers"].__len__() == 8
    )
    # With --watch-nodes (as deployed) every pod is bounded by the nodes it may run on.
    prepared = Prepared(DEFAULT_POLICY)  # as a server holds it: one, for as long as the policy
    nodes = Prepared(
        DEFAULT_POLICY,
        [
            GpuNode(f"gpu-{i}", 80 if i % 4 else 24, 8, {"pool": f"p{i % 4}", "host": f"gpu-{i}"})
            for i in range(500)
        ],
    )
    assert admit(body, nodes).outcome == admit(body, prepared).outcome
    sample = bodies[::7]  # a seventh of the mix: every kind of review in its share
    requests = [decode(b)[1] for b in sample]
    _audit_lines_to(os.open(os.devnull, os.O_WRONLY))
    answered = [admit(b, prepared) for b in sample]
    subjects: dict[str, Any] = {
        "webhook": lambda: admit(body, prepared).encode(),
        "floor": lambda: json.dumps(json.loads(body)).encode(),
        "webhook_500_nodes": lambda: admit(body, nodes).encode(),
        "mix": lambda: [admit(b, prepared).encode() for b in sample],
        # Where a review of the mix goes: read, decided, and its log line.
        "mix_json_loads": lambda: [json.loads(b) for b in sample],
        "mix_read": lambda: [decode(b) for b in sample],
        "mix_decide": lambda: [decide(r, prepared) for r in requests],
        "mix_log_line": lambda: [log_admission(r, 0.0001) for r in answered],
    }
    # Rounds of the subjects alternate, and each keeps its best: a machine
    # that slows down for a while slows all of them, not the one it caught.
    best = dict.fromkeys(subjects, float("inf"))
    for _ in range(7):
        for name, fn in subjects.items():
            t0 = time.perf_counter()
            for _ in range(rounds):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / rounds * 1e6)
    for name in best:
        if name.startswith("mix"):
            best[name] /= len(sample)  # per review of the benchmark's mix
    best["ratio"] = best["webhook"] / best["floor"]
    return best


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="small trials: the whole run in under a minute"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results.json"))
    parser.add_argument(
        "--worker-class",
        default="buffering",
        choices=("buffering", "gthread", "sync", "gevent"),
        help="gunicorn worker model of both servers, to compare models (default: %(default)s)",
    )
    parser.add_argument(
        "--generator",
        default="auto",
        choices=("auto", "wrk", "python"),
        help="load generator: wrk when on the PATH (auto), or Python threads",
    )
    parser.add_argument(
        "--soak",
        type=int,
        default=None,
        metavar="N",
        help="reviews sent at concurrency 8 after the trials, for RSS growth "
        "(default: 100000, 3000 with --quick)",
    )
    parser.add_argument(
        "--apiserver",
        action="store_true",
        help="run only the part through the real kube-apiserver (bench/apiserver.py) and write "
        "it under the key 'apiserver' of --out",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="run only the memory of the server as deployed (bench/memory.py) and write it "
        "under the key 'memory' of --out",
    )
    parser.add_argument(
        "--scheduler",
        action="store_true",
        help="run only pods from create to bound and Running through kube-scheduler, the GPU "
        "share scheduler extender and KWOK's fake nodes (bench/scheduler.py; needs Go and "
        "GPUSHARE_EXTENDER_SOURCE) and write it under the key 'scheduler' of --out",
    )
    parser.add_argument(
        "--node",
        action="store_true",
        help="run only the node agent's footprint (bench/node.py) and write it under the key "
        "'node' of --out",
    )
    parser.add_argument(
        "--disruption",
        action="store_true",
        help="run only pod creates at 20 a second through a rolling update, a certificate "
        "rotation, a policy edit, a guard upgrade and a SIGKILL, drain on and off "
        "(bench/disruption.py) and write it under the key 'disruption' of --out",
    )
    args = parser.parse_args()
    if args.disruption:
        return cluster_part("disruption", Path(args.out), quick=args.quick)
    if args.node:
        return cluster_part("node", Path(args.out), quick=args.quick)
    if args.scheduler:
        missing = _scheduling_tier_missing()
        if missing:
            print(f"bench --scheduler: {missing}", file=sys.stderr)
            return 2
        return cluster_part("scheduler", Path(args.out), quick=args.quick)
    if args.apiserver:
        return cluster_part("apiserver", Path(args.out), quick=args.quick)
    if args.memory:
        return cluster_part("memory", Path(args.out), quick=args.quick)
    levels = [1, 8, 32]
    trials, requests = (3, 300) if args.quick else (5, 3000)
    soak = args.soak if args.soak is not None else (3000 if args.quick else 100_000)
    wrk = shutil.which("wrk") if args.generator != "python" else None
    if args.generator == "wrk" and wrk is None:
        parser.error("--generator wrk: wrk is not on the PATH (Debian: apt-get install wrk)")
    bodies = mix(200)
    with tempfile.TemporaryDirectory() as tmp:
        bodies_file = Path(tmp) / "bodies.jsonl"
        bodies_file.write_bytes(b"\n".join(bodies) + b"\n")

        def run_trial(port: int, level: int, count: int) -> dict[str, Any]:
            if wrk is None:
                return trial(port, context, bodies, level, count)
            # wrk runs for a time: aim at about as many requests as the Python client sends.
            return wrk_trial(wrk, port, bodies_file, level, count / 1500)

        issued = tls.ensure_certificates(Path(tmp), dns_names=["localhost"], ips=["127.0.0.1"])
        context = ssl.create_default_context(cafile=str(issued.ca))
        wport, fport = free_port(), free_port()
        pair = [
            "--cert",
            str(issued.cert),
            "--key",
            str(issued.key),
            "--worker-class",
            args.worker_class,
        ]
        webhook, startup = start(
            [
                sys.executable,
                "-m",
                "webhook",
                "serve",
                "--bind",
                f"127.0.0.1:{wport}",
                *pair,
            ],
            wport,
            context,
        )
        floor, _ = start(
            [
                sys.executable,
                "-m",
                "bench.floor",
                "--bind",
                f"127.0.0.1:{fport}",
                *pair,
            ],
            fport,
            context,
        )
        try:
            rss_start = workers_rss_mib(webhook)
            results: dict[str, Any] = {"concurrency": {}}
            for level in levels:
                runs: dict[str, list[dict[str, Any]]] = {"webhook": [], "floor": []}
                for _ in range(trials):  # alternate, so drift hits both alike
                    runs["webhook"].append(run_trial(wport, level, requests))
                    runs["floor"].append(run_trial(fport, level, requests))
                results["concurrency"][str(level)] = {
                    **{name: median_of(r) for name, r in runs.items()},
                    "paired": paired(runs["webhook"], runs["floor"]),
                }
            rss_trials = workers_rss_mib(webhook)
            soaked = run_trial(wport, 8, soak)
            rss_end = workers_rss_mib(webhook)
        finally:
            for proc in (webhook, floor):
                proc.terminate()
                proc.wait(timeout=30)
    results["decision_us"] = decision_us(bodies, 50 if args.quick else 300)
    results["rss_mib"] = {
        "start": max(rss_start or [0]),
        "after_trials": max(rss_trials or [0]),
        "end": max(rss_end or [0]),
    }
    results["soak"] = {
        "requests": soaked["requests"],
        "errors": soaked["errors"],
    }
    results["generator"] = "wrk" if wrk else "python"
    results["startup_s"] = startup
    results["worker_class"] = args.worker_class
    results["client_cpu_share"] = max(
        v[name]["client_cpu_share"]
        for v in results["concurrency"].values()
        for name in ("webhook", "floor")
    )
    print(
        f"{'c':>3} {'webhook rps':>12} {'floor rps':>10} {'ratio':>6} {'paired':>6} "
        f"{'p50 ms w/f':>14} {'p99 ms w/f':>14} {'p99 paired':>10} {'errors':>7}"
    )
    for level, row in results["concurrency"].items():
        w, f, pair = row["webhook"], row["floor"], row["paired"]
        print(
            f"{level:>3} {w['rps']:>12.0f} {f['rps']:>10.0f} {w['rps'] / f['rps']:>6.2f} "
            f"{pair['rps_ratio']:>6.2f} "
            f"{w['p50_ms']:>6.2f}/{f['p50_ms']:<7.2f} {w['p99_ms']:>6.2f}/{f['p99_ms']:<7.2f} "
            f"{pair['p99_ms_ratio']:>10.2f} {w['errors'] + f['errors']:>7}"
        )
    d = results["decision_us"]
    print(
        f"decision (8 containers): {d['webhook']:.0f} us vs json round trip "
        f"{d['floor']:.0f} us (x{d['ratio']:.1f}); {d['webhook_500_nodes']:.0f} us "
        f"with 500 GPU nodes known; {d['mix']:.0f} us a review of the mix"
    )
    print(
        f"a review of the mix: read {d['mix_read']:.0f} us (json.loads alone "
        f"{d['mix_json_loads']:.0f}), decided {d['mix_decide']:.0f}, answer written "
        f"{d['mix'] - d['mix_read'] - d['mix_decide']:.0f}, log line {d['mix_log_line']:.0f}"
    )
    print(
        f"worker RSS: {results['rss_mib']['start']:.1f} -> "
        f"{results['rss_mib']['after_trials']:.1f} after the trials -> "
        f"{results['rss_mib']['end']:.1f} MiB after {results['soak']['requests']} more reviews "
        f"({results['soak']['errors']} errors); generator: {results['generator']}; "
        f"start-up to first review: {startup:.2f} s; "
        f"client CPU share (max): {results['client_cpu_share']:.2f}"
    )
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def _scheduling_tier_missing() -> str | None:
    """Why the scheduling tier cannot be built here (no Go, no extender source), if so."""
    from tests.controlplane import build, extender

    try:
        build.find_go()
        extender.source()
    except build.Unavailable as error:
        return str(error).splitlines()[0]
    return None


def cluster_part(name: str, out: Path, *, quick: bool) -> int:
    """A part that runs against the tests' control plane: bench/apiserver.py, bench/memory.py,
    bench/scheduler.py or bench/disruption.py."""
    import importlib

    from tests.controlplane.build import Unavailable
    from tests.controlplane.cluster import ControlPlaneError

    part = importlib.import_module(f"bench.{name}")
    try:
        found = part.run(quick)
    except (Unavailable, ControlPlaneError, RuntimeError, OSError) as error:
        print(f"bench --{name}: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    part.report(found)
    results = json.loads(out.read_text()) if out.exists() and out.stat().st_size else {}
    results[name] = found
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
