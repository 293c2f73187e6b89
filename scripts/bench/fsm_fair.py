#!/usr/bin/env python3
"""The state machine's cost for a fair queue, in process (no network, no Raft): entries of
100 operations on a round-robin queue of many two-level groups, as a cluster applies them.

    python scripts/bench/fsm_fair.py --messages 50000 --groups 1000

Enqueues --messages messages over --groups groups (tenantN.userM), then takes each one
(dequeue without ack) and acks it, all in entries of 100 operations on a real LMDB store in
a temporary folder. Prints the operations per second of each phase as a JSON line. Run it
from two checkouts in turn, in the same session, to compare them (ratios of one run).
``--consumer NAME`` names the consumer of the takes and ``--tokens`` acks with each
delivery's token, as DOQ's own clients do (the consumers registry and fenced settles);
``--many`` takes 100 in one operation and acks them in one (a prefetching consumer).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from doq_lib import commands as C  # noqa: E402
from doq_lib.fsm import StateMachine  # noqa: E402
from doq_lib.lmdb_store import LmdbStore  # noqa: E402

T0 = 1_700_000_000_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--groups", type=int, default=1_000)
    ap.add_argument("--consumer", default="", help="the takes' consumer name")
    ap.add_argument("--tokens", action="store_true", help="ack with delivery tokens")
    ap.add_argument("--many", action="store_true", help="take and ack 100 per operation")
    args = ap.parse_args()
    messages, groups = min(args.messages, 1_000_000), max(1, min(args.groups, 100_000))
    path = tempfile.mkdtemp(prefix="doq-fsm-fair-")
    store = LmdbStore(path)
    sm = StateMachine(store)
    index = [0]

    def apply(ops: list[C.Op]) -> list[tuple[int, object]]:
        index[0] += 1
        out = sm.apply_entries([(index[0], ops, T0 + index[0])])[0]
        assert out is not None
        return out

    try:
        apply([C.create_queue("f", "fair", 1, 0, 3600, 1800)])
        out = {}
        started = time.perf_counter()
        for start in range(0, messages, 100):
            apply([C.enqueue("f", 0, f"tenant{n % groups}.user{n % 7}", n % 5, "x" * 64, None)
                   for n in range(start, min(messages, start + 100))])
        out["enqueue_per_s"] = round(messages / (time.perf_counter() - started))
        started = time.perf_counter()
        taken = 0
        while taken < messages:
            if args.many:
                code, value = apply([C.dequeue_many("f", False, 100, args.consumer)])[0]
                values = value if code == 0 else []
                if not values:
                    break
                apply([C.ack_ids("f", [v[0] for v in values],
                                 [(v[5], v[8]) for v in values] if args.tokens else None)])
                taken += len(values)
                continue
            got = apply([C.dequeue("f", False, args.consumer) for _ in range(100)])
            values = [value for code, value in got if code == 0]
            if not values:
                break
            apply([C.ack("f", v[0], (v[5], v[8]) if args.tokens else None)  # type: ignore[index]
                   for v in values])
            taken += len(values)
        out["take_and_ack_per_s"] = round(taken / (time.perf_counter() - started))
        out["taken"] = taken
        print(json.dumps(out))
        return 0 if taken == messages else 1
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
