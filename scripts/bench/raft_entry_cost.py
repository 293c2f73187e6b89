#!/usr/bin/env python3
"""CPU per Raft entry and per operation, without HTTP: three RaftNodes in this one process.

    python scripts/bench/raft_entry_cost.py [--repo DIR] [--ops 1,4,16] [--spread 3]

``--ops K``: the leader proposes batches of K enqueues, at most 4 in flight, and the process's
CPU (all three nodes: user + system) is divided by the batches and by the operations.
``--spread K``: all three nodes propose batches of K at once, as under load through every
node; the leader merges what arrives between two ticks (doq_lib/raft/tick.py), and the line
reports the log entries that carried them. ``--repo`` runs another checkout's code (the code
before a change) with this script. Bounded by the batch counts and ``--max-seconds``; loopback
only.
"""
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Proposer:
    """Keeps up to ``window`` batches of ``ops`` enqueues in flight on one node."""

    def __init__(self, node: Any, ops: int, total: int, window: int = 4) -> None:
        self.node, self.ops, self.total, self.window = node, ops, total, window
        self.sent = self.done = self.inflight = 0
        self.wake = gevent.event.Event()

    def _callback(self) -> Callable[[Any, int], None]:
        def committed(result: Any, error: int) -> None:
            if error == 0 and result is not None:
                result.add_callback(lambda _: self._finished())
            else:
                self._finished()
        return committed

    def _finished(self) -> None:
        self.inflight -= 1
        self.done += 1
        self.wake.set()

    def fill(self, c_module: Any) -> None:
        while self.inflight < self.window and self.sent < self.total:
            batch = [(c_module.ENQUEUE, "q", 0, "", 1, "x" * 256, None) for _ in range(self.ops)]
            self.node.propose(batch, int(time.time() * 1000), self._callback())
            self.inflight += 1
            self.sent += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(HERE)))
    ap.add_argument("--ops", default="1,4,16", help="batch sizes proposed by the leader alone")
    ap.add_argument("--batches", type=int, default=2000, help="batches per measurement")
    ap.add_argument("--spread", type=int, default=3,
                    help="batch size proposed by all three nodes at once (0: skip)")
    ap.add_argument("--max-seconds", type=float, default=120)
    a = ap.parse_args()
    if not 10 <= a.batches <= 100_000:
        raise SystemExit("--batches 10-100000")
    sys.path.insert(0, os.path.abspath(a.repo))
    from doq_lib import commands as C
    # This checkout's helper, whichever checkout's doq_lib it runs.
    spec = importlib.util.spec_from_file_location(
        "local_raft", os.path.join(HERE, "..", "..", "tests", "probes", "local_raft.py"))
    assert spec is not None and spec.loader is not None
    local_raft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(local_raft)
    nodes = local_raft.start_nodes(tempfile.mkdtemp(prefix="doq-raft-bench-"))
    leader = local_raft.leader_of(nodes)
    local_raft.create_queue(leader)

    def measure(proposers: list[Proposer], label: dict[str, Any]) -> None:
        first_index = leader.raftCommitIndex
        started, start_cpu = time.monotonic(), cpu()
        while any(p.done < p.total for p in proposers):
            if time.monotonic() - started > a.max_seconds:
                raise SystemExit("time limit reached")
            proposers[0].wake.clear()
            for p in proposers:
                p.fill(C)
            proposers[0].wake.wait(0.5)
        elapsed, used = time.monotonic() - started, cpu() - start_cpu
        batches = sum(p.total for p in proposers)
        ops = sum(p.total * p.ops for p in proposers)
        print(json.dumps({**label, "batches": batches, "log_entries":
                          leader.raftCommitIndex - first_index,
                          "batches_s": round(batches / elapsed), "ops_s": round(ops / elapsed),
                          "cpu_ms_per_batch": round(1000 * used / batches, 3),
                          "cpu_ms_per_op": round(1000 * used / ops, 3)}), flush=True)

    for k in [int(x) for x in a.ops.split(",") if x]:
        measure([Proposer(leader, k, a.batches)], {"repo": a.repo, "proposers": "leader",
                                                   "ops_per_batch": k})
    if a.spread:
        proposers = [Proposer(n, a.spread, a.batches) for n in nodes]
        for p in proposers[1:]:
            p.wake = proposers[0].wake                  # one event wakes the loop
        measure(proposers, {"repo": a.repo, "proposers": "all three",
                            "ops_per_batch": a.spread})
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
