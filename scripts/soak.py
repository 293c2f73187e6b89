#!/usr/bin/env python3
"""Soak: a 3-node cluster under mixed traffic for a long time, watching that nothing grows.

Producers and consumers as in the chaos harness (enqueue; dequeue with ack=false, then ack;
5 % slow consumers whose lease runs out), plus a mixer that makes batch enqueues, batch
consumes with acks and nacks, touches, priority updates and short-lived queues. Every
``--sample`` seconds it records, per node: resident memory, open file descriptors, the Raft
journal's size and the store's (LMDB, allocated bytes). At the end it stops the load, drains
the queues and checks:

  1. the chaos harness's invariants (nothing acknowledged lost, no ack undone, no second
     delivery within a lease, replicas identical);
  2. memory is flat: each node's median RSS over the last quarter is at most 1.3 times (plus
     16 MiB) its median over the second quarter (the first quarter is warm-up); in a run of
     20 minutes or more, the anonymous part grows by at most 8 MiB an hour over the second
     half (least-squares slope);
  3. file descriptors are flat: after the warm-up they move within 16 of each other;
  4. the journal stays bounded by snapshots: never above 2 x raft.snapshot_max_log_bytes
     (set here to 8 MiB) plus one batch;
  5. the store does not keep growing: its size over the last quarter is at most 1.25 times
     (plus 16 MiB) its size at the end of the second quarter (backup history is kept for
     2 minutes here, instead of a day).

    python scripts/soak.py --minutes 30 --plot docs/images/soak-30min.png

Bounded in time and count; loopback only; the nodes are stopped by the PIDs it started.
Prints a summary and a JSON line; exits 1 on any violation.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(SCRIPTS)
sys.path.insert(0, REPO)
sys.path.insert(0, SCRIPTS)

import chaos  # noqa: E402 - the same load, history and invariants

from tests.harness import Cluster, Http, NodeProc  # noqa: E402

LOG_BYTES = 8 << 20                     # raft.snapshot_max_log_bytes of the soak's nodes
HISTORY_SECONDS = 120                   # storage.history_seconds of the soak's nodes
LONG_RUN = 20 * 60                      # runs this long (seconds) are also held to:
ANON_SLOPE_MIB_H = 8.0                  # anonymous memory growing at most this fast


# -- what is measured ---------------------------------------------------------------------------
def memory(pid: int) -> dict[str, float]:
    """Resident memory, and its two parts: anonymous pages (the Python heap, the interpreter's
    and libraries' allocations) and file pages (mostly the store's memory map, which grows with
    the pages of the LMDB file that have been read, up to the file's size)."""
    wanted = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file"}
    out = {v: 0.0 for v in wanted.values()}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key = line.split(":", 1)[0] + ":"
            if key in wanted:
                out[wanted[key]] = int(line.split()[1]) * 1024
    return out


def allocated(path: str) -> int:
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def store_bytes(node_dir: str) -> int:
    total = 0
    for root, _, files in os.walk(node_dir):
        total += sum(allocated(os.path.join(root, f)) for f in files if f.endswith(".mdb"))
    return total


def sample(node: NodeProc) -> dict[str, float]:
    assert node.proc is not None
    pid = node.proc.pid
    node_dir = os.path.join(node.data_dir, node.node_id)
    return {**memory(pid), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "journal": allocated(os.path.join(node_dir, "raft", "journal.bin")),
            "store": store_bytes(node_dir)}


class Sampler(threading.Thread):
    def __init__(self, cluster: Cluster, every: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.every = cluster, every
        self.stop = threading.Event()
        self.rows: list[tuple[float, str, dict[str, float]]] = []
        self.started = time.monotonic()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            at = time.monotonic() - self.started
            for node in self.cluster.nodes:
                if node.alive():
                    self.rows.append((at, node.node_id, sample(node)))


# -- the mixer ----------------------------------------------------------------------------------
class Mixer(threading.Thread):
    """Batch enqueues and consumes, nacks, touches, priority updates and short-lived queues,
    about once a second, through every node in turn."""

    def __init__(self, nodes: list[NodeProc]) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.stop = threading.Event()
        self.rounds = 0
        self.errors = 0

    def run(self) -> None:
        n = 0
        while not self.stop.wait(1.0) and n < 1_000_000:
            node = self.nodes[n % len(self.nodes)]
            http = Http(node.http_port, host=node.host, timeout=8)
            try:
                self._round(http, n)
                self.rounds += 1
            except Exception:  # noqa: BLE001 - counted; the invariants judge the outcome
                self.errors += 1
            finally:
                http.close()
            n += 1

    @staticmethod
    def _round(http: Http, n: int) -> None:
        base = "/API/v1/queues/mixed/messages"
        http.post(f"{base}/batch", {"messages": [
            {"content": f"m{n}-{i}", "priority": i % 7, "group": f"g{i % 5}",
             "metadata": {"round": str(n)}} for i in range(20)]})
        taken = http.get(f"{base}?ack=false&count=10")
        ids = [m["id"] for m in taken.json().get("messages", [])] if taken.status == 200 else []
        if ids:
            http.post(f"{base}/{ids[0]}/touch")
            http.post(f"{base}/nack", {"ids": ids[:3], "priority": 1})
            http.post(f"{base}/ack", {"ids": ids[3:]})
        http.get(f"{base}?ack=true&count=20")
        temp = f"temp-{n % 10}"
        http.post("/API/v1/queues", {"name": temp, "type": "delayed"})
        http.post(f"/API/v1/queues/{temp}/messages", {"content": "t", "priority": 1})
        http.delete(f"/API/v1/queues/{temp}")


# -- verdicts -----------------------------------------------------------------------------------
def quarter(rows: list[tuple[float, dict[str, float]]], q: int, key: str) -> list[float]:
    if not rows:
        return []
    end = rows[-1][0]
    return [r[key] for at, r in rows if q * end / 4 <= at <= (q + 1) * end / 4]


def slope(rows: list[tuple[float, dict[str, float]]], key: str) -> float:
    """Least-squares slope (units per second) of ``key`` over the second half of the run."""
    half = [(at, r[key]) for at, r in rows if at >= rows[-1][0] / 2] if rows else []
    if len(half) < 3:
        return 0.0
    mx = statistics.fmean(a for a, _ in half)
    my = statistics.fmean(v for _, v in half)
    den = sum((a - mx) ** 2 for a, _ in half)
    return sum((a - mx) * (v - my) for a, v in half) / den if den else 0.0


def flatness(rows: list[tuple[float, str, dict[str, float]]]) -> tuple[dict[str, Any],
                                                                      list[str]]:
    report: dict[str, Any] = {}
    problems = []
    for node_id in sorted({r[1] for r in rows}):
        mine = [(at, s) for at, who, s in rows if who == node_id]
        rss2, rss4 = quarter(mine, 1, "rss"), quarter(mine, 3, "rss")
        fds = [s["fds"] for at, s in mine if at >= mine[-1][0] / 4] if mine else []
        store2, store4 = quarter(mine, 1, "store"), quarter(mine, 3, "store")
        journal = max((s["journal"] for _, s in mine), default=0)
        if not (rss2 and rss4 and fds and store2 and store4):
            problems.append(f"{node_id}: too few samples")
            continue
        mib = 1 << 20
        report[node_id] = {
            "rss_mib_q2_q4": [round(statistics.median(rss2) / mib, 1),
                              round(statistics.median(rss4) / mib, 1)],
            "anon_mib_q2_q4": [round(statistics.median(quarter(mine, q, "anon")) / mib, 1)
                               for q in (1, 3)],
            "file_mib_q2_q4": [round(statistics.median(quarter(mine, q, "file")) / mib, 1)
                               for q in (1, 3)],
            "anon_mib_per_hour": round(slope(mine, "anon") * 3600 / mib, 1),
            "fds_min_max": [min(fds), max(fds)],
            "journal_max_mib": round(journal / mib, 1),
            "store_mib_q2_q4": [round(store2[-1] / mib, 1), round(max(store4) / mib, 1)]}
        if statistics.median(rss4) > 1.3 * statistics.median(rss2) + 16 * mib:
            problems.append(f"{node_id}: memory grew {report[node_id]['rss_mib_q2_q4']} MiB")
        if mine[-1][0] >= LONG_RUN and report[node_id]["anon_mib_per_hour"] > ANON_SLOPE_MIB_H:
            problems.append(f"{node_id}: anonymous memory grows "
                            f"{report[node_id]['anon_mib_per_hour']} MiB an hour")
        if max(fds) - min(fds) > 16:
            problems.append(f"{node_id}: file descriptors moved {min(fds)}..{max(fds)}")
        if journal > 2 * LOG_BYTES + 4 * mib:
            problems.append(f"{node_id}: journal reached {journal} bytes")
        if max(store4) > 1.25 * store2[-1] + 16 * mib:
            problems.append(f"{node_id}: store grew {report[node_id]['store_mib_q2_q4']} MiB")
    return report, problems


def plot(rows: list[tuple[float, str, dict[str, float]]], path: str, minutes: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    panels = [("rss", "resident memory (MiB): all; dashed: anonymous", 1 << 20),
              ("fds", "open file descriptors", 1),
              ("journal", "Raft journal (MiB)", 1 << 20), ("store", "LMDB store (MiB)", 1 << 20)]
    for ax, (key, title, unit) in zip(axes.flat, panels):
        for node_id in sorted({r[1] for r in rows}):
            mine = [(at / 60, s) for at, who, s in rows if who == node_id]
            line, = ax.plot([m[0] for m in mine], [m[1][key] / unit for m in mine],
                            label=node_id, linewidth=1)
            if key == "rss":
                ax.plot([m[0] for m in mine], [m[1]["anon"] / unit for m in mine],
                        linestyle="--", linewidth=1, color=line.get_color())
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    axes[0][0].legend()
    fig.suptitle(f"DOQ soak: 3 nodes, mixed traffic, {minutes:g} minutes")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)


# -- the run ------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=150.0, help="enqueues per second (chaos load)")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plot", default="", help="a PNG to draw the samples in (matplotlib)")
    ap.add_argument("--data-dir", default="")
    a = ap.parse_args()
    # SIGTERM ends the run like Ctrl-C: the nodes it started are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    root = a.data_dir or tempfile.mkdtemp(prefix="doq-soak-")
    c = Cluster(root, size=3, flags={
        "queue.default_acknowledgement_timeout": str(chaos.ACK_TIMEOUT),
        "raft.snapshot_max_log_bytes": str(LOG_BYTES), "logging.level": "warning",
        # change records for incremental backups are kept this long (24 h by default): a
        # soak shorter than that would see them grow, as designed
        "storage.history_seconds": str(HISTORY_SECONDS)}).start()
    h = chaos.History()
    try:
        leader = c.leader().http()
        for name, qtype in (("chaos", "delayed"), ("mixed", "fair")):
            assert leader.post("/API/v1/queues", {"name": name, "type": qtype}).status == 200
        load = chaos.Load(c.nodes, h, 3, 4, a.seed, a.rate)
        mixer, sampler = Mixer(c.nodes), Sampler(c, a.sample)
        sampler.start()
        load.start()
        mixer.start()
        time.sleep(a.minutes * 60)
        load.finish()
        mixer.stop.set()
        mixer.join(30)
        sampler.stop.set()
        sampler.join(30)
        c.wait_ready(60)
        states = c.assert_replicas_identical(timeout=60)
        drained = chaos.drain(c)
        problems = chaos.check(h, drained, [], 15.0)
        if len({s["digest"] for s in states}) != 1:
            problems.append("replicas diverged")
        report, flat = flatness(sampler.rows)
        problems += flat
        if a.plot:
            plot(sampler.rows, a.plot, a.minutes)
    finally:
        c.stop()
    result = {"minutes": a.minutes, "enqueued_acked": len(h.enqueued),
              "consumer_acked": len(h.acked), "deliveries": len(h.deliveries),
              "mixer_rounds": mixer.rounds, "mixer_errors": mixer.errors,
              "samples": len(sampler.rows), "nodes": report, "violations": problems}
    chaos.print_summary(result)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
