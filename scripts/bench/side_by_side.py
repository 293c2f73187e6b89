#!/usr/bin/env python3
"""Side by side with RabbitMQ quorum queues, in the same run (the issues' acceptance runs).

Runs the shared harness (``../shared/bench/queue_bench.py``, workload ``all``) against, in
turn within every round: a RabbitMQ cluster that is already running (``start_rabbitmq.sh
cluster``: AMQP on 5672-5674), a fresh 3-node DOQ cluster of this checkout over HTTP (one
message per request, then ``--doq-batch 64``), and with ``--before DIR`` the same against a
3-node cluster of another checkout (the code before a change). Prints every result line,
then medians per target and the ratios to RabbitMQ.

    python scripts/bench/side_by_side.py --rounds 3 --harness-python <venv with aio-pika>

Bounded: each harness run has its own message count and per-phase time cap; only loopback
addresses are used. The DOQ clusters live in temporary directories and are stopped (by the
PIDs this script started) at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import http_bench  # noqa: E402 - the same local cluster

REPO = http_bench.REPO
HARNESS = os.path.join(REPO, "..", "shared", "bench", "queue_bench.py")
AMQP = ",".join(f"amqp://guest:guest@127.0.0.1:{p}/" for p in (5672, 5673, 5674))
KEYS = ["produce_msgs_s", "consume_msgs_s", "enq_p50_ms", "enq_p99_ms"]


class Checkout(http_bench.LocalCluster):
    """A local 3-node cluster started from ``repo`` (this checkout or another one)."""

    def __init__(self, repo: str, flags: list[str]) -> None:
        saved = http_bench.REPO
        http_bench.REPO = repo
        try:
            super().__init__(3, flags)
        finally:
            http_bench.REPO = saved

    def pids(self) -> str:
        return ",".join(str(p.pid) for p in self.procs)

    def grpc_addrs(self) -> str:
        """The nodes' gRPC addresses (they serve gRPC when started with --grpc)."""
        import urllib.request
        addrs = []
        for u in self.urls:
            with urllib.request.urlopen(f"{u}/internal/status", timeout=5) as r:
                addrs.append(json.load(r)["grpc_addr"])
        return ",".join(addrs)

    def wait_ready(self, timeout: float = 60) -> None:
        import urllib.request
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if all(urllib.request.urlopen(f"{u}/readyz", timeout=2).status == 200
                       for u in self.urls):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit("DOQ cluster not ready within 60 s")


def beam_pids() -> str:
    out = subprocess.run(["pgrep", "-f", "beam.smp.*rabbit"], capture_output=True, text=True)
    return ",".join(out.stdout.split())


def harness(python: str, args: list[str]) -> dict[str, Any]:
    done = subprocess.run([python, HARNESS, *args], capture_output=True, text=True,
                          timeout=900, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"harness failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=20000, help="messages per produce / consume phase")
    ap.add_argument("--harness-python", default=sys.executable,
                    help="a Python with the harness's clients (aiohttp, aio-pika, uvloop)")
    ap.add_argument("--before", default="", help="another checkout to run beside this one")
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--no-batch", action="store_true", help="skip the --doq-batch 64 runs")
    ap.add_argument("--no-rabbit-get", action="store_true",
                    help="skip RabbitMQ's one-message consumer (basic.get + ack), the yardstick "
                         "of DOQ's one-message-per-request consumers")
    ap.add_argument("--grpc", action="store_true",
                    help="the DOQ clusters serve gRPC too, and the doq-grpc target runs beside "
                         "doq-http (the harness's Python needs grpcio and protobuf)")
    ap.add_argument("--no-http", action="store_true", help="skip the doq-http runs")
    ap.add_argument("--before-no-batch", action="store_true",
                    help="skip the --doq-batch 64 runs of the --before cluster only")
    ap.add_argument("--flag", action="append", default=[], help="extra DOQ node flag")
    ap.add_argument("--doq-flag", action="append", default=[],
                    help="extra node flag of this checkout's cluster only")
    ap.add_argument("--before-flag", action="append", default=[],
                    help="extra node flag of the --before cluster only (--before . compares "
                         "two settings of this checkout)")
    ap.add_argument("--workload", default="all", choices=["all", "produce", "consume"],
                    help="the harness's workload (all: produce, consume, latency)")
    ap.add_argument("--out", default="", help="append every result line to this JSONL file")
    a = ap.parse_args()
    if not 1 <= a.rounds <= 10 or not 1000 <= a.n <= 200_000:
        raise SystemExit("--rounds 1-10, -n 1000-200000")
    checkouts = [("doq", REPO)] + ([("before", os.path.abspath(a.before))] if a.before else [])
    clusters = {}
    try:
        for name, repo in checkouts:
            own = a.before_flag if name == "before" else a.doq_flag
            clusters[name] = Checkout(repo, a.flag + own
                                      + (["--grpc.address=127.0.0.1:0"] if a.grpc else []))
        for c in clusters.values():
            c.wait_ready()
        rows: dict[str, list[dict[str, Any]]] = {}
        common = ["-n", str(a.n), "--max-seconds", "120", "--workload", a.workload]
        for rnd in range(a.rounds):
            runs: list[tuple[str, list[str]]] = []
            if not a.no_rabbitmq:
                rabbit = ["--target", "rabbitmq", "--rabbit-queue-type", "quorum",
                          "--amqp-urls", AMQP, "--server-pids", beam_pids()]
                runs.append(("rabbitmq", rabbit))
                if not a.no_rabbit_get:     # one message per request: basic.get + ack
                    runs.append(("rabbitmq-get", rabbit + ["--rabbit-consume", "get"]))
            for name, c in clusters.items():
                batch = not a.no_batch and not (name == "before" and a.before_no_batch)
                base = ["--target", "doq-http", "--doq-urls", ",".join(c.urls),
                        "--server-pids", c.pids(), "--queue", f"bench{rnd}"]
                if not a.no_http:
                    runs.append((f"{name}-http", base))
                    if batch:
                        runs.append((f"{name}-http-batch64", base + ["--doq-batch", "64"]))
                if a.grpc:
                    repo = dict(checkouts)[name]
                    grpc_base = ["--target", "doq-grpc", "--doq-grpc-addrs", c.grpc_addrs(),
                                 "--doq-project", repo, "--doq-urls", ",".join(c.urls),
                                 "--server-pids", c.pids(), "--queue", f"benchg{rnd}"]
                    runs.append((f"{name}-grpc", grpc_base))
                    if batch:
                        runs.append((f"{name}-grpc-batch64", grpc_base + ["--doq-batch", "64"]))
            if rnd % 2:
                runs.reverse()
            for label, args in runs:
                res = harness(a.harness_python, args + common + ["--label", label])
                res["round"] = rnd
                rows.setdefault(label, []).append(res)
                line = json.dumps(res)
                print(line, flush=True)
                if a.out:
                    with open(a.out, "a") as f:
                        f.write(line + "\n")
        print()
        print("| target | produce msg/s | consume+ack msg/s | enqueue p50 / p99 ms | "
              "server CPU ms per message, produce / consume+ack | runs |")
        print("|---|---|---|---|---|---|")
        med: dict[str, dict[str, float]] = {}
        for label, results in rows.items():
            med[label] = {k: statistics.median(r.get(k) or 0 for r in results) for k in KEYS}
            for phase in ("produce", "consume"):
                cpu = [1000 * r[f"{phase}_server_cores"] / r[f"{phase}_msgs_s"]
                       for r in results if r.get(f"{phase}_msgs_s")]
                if cpu:
                    med[label][f"{phase}_cpu_ms"] = statistics.median(cpu)
            runs_text = "; ".join(f"{r.get('produce_msgs_s', 0):,.0f} / "
                                  f"{r.get('consume_msgs_s', 0):,.0f} / "
                                  f"{r.get('enq_p50_ms', 0):.2f}" for r in results)
            m = med[label]
            print(f"| {label} | {m['produce_msgs_s']:,.0f} | {m['consume_msgs_s']:,.0f} | "
                  f"{m['enq_p50_ms']:.2f} / {m['enq_p99_ms']:.2f} | "
                  f"{m.get('produce_cpu_ms', 0):.2f} / {m.get('consume_cpu_ms', 0):.2f} | "
                  f"{runs_text} |")
        if "rabbitmq" in med:
            r, get = med["rabbitmq"], med.get("rabbitmq-get", {})
            print()
            for label, m in med.items():
                if label.startswith("rabbitmq"):
                    continue
                # one message per request against basic.get + ack; prefetching against push
                consumed = get if get and "batch" not in label else r
                yardstick = "basic.get" if consumed is get else "push"
                print(f"{label}: " + ", ".join(
                    f"{name} {m[key] / base[key]:.2f}x" for name, key, base in (
                        ("produce", "produce_msgs_s", r),
                        (f"consume+ack (against {yardstick})", "consume_msgs_s", consumed),
                        ("p50", "enq_p50_ms", r), ("p99", "enq_p99_ms", r)) if base.get(key))
                    + " of RabbitMQ's")
    finally:
        for c in clusters.values():
            c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
