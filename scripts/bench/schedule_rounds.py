#!/usr/bin/env python3
"""What firing schedules costs the leader, in process (no network, no Raft): --schedules
schedules of one queue, all due each second, fired round after round for --seconds seconds
of a clock moved by hand, through the service's scheduler and the real state machine on
LMDB in a temporary folder.

    python scripts/bench/schedule_rounds.py --schedules 1000 --seconds 20 --cron

Each round plans every due schedule (schedules.plan, croniter for cron ones) and proposes
its fire; the in-process proposer applies each at once. Prints, as a JSON line, the
occurrences fired and the microseconds of CPU per occurrence: planning and applying
together, and planning alone (``--cron``: "* * * * * " in Europe/Berlin, one occurrence a
minute, so each round moves the clock a minute; else every 1 s).
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

from doq_lib import schedules  # noqa: E402
from doq_lib.config import Config  # noqa: E402
from doq_lib.fsm import StateMachine  # noqa: E402
from doq_lib.lmdb_store import LmdbStore  # noqa: E402
from doq_lib.raft.proposer import LocalProposer  # noqa: E402
from doq_lib.service import Service  # noqa: E402


class HandClock:
    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=20, help="rounds (each one step of time)")
    ap.add_argument("--cron", action="store_true", help='"* * * * *" in Europe/Berlin')
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="schedule-rounds-")
    store = LmdbStore(folder)
    try:
        cfg = Config()
        clock = HandClock(1_790_000_000.0)
        fsm = StateMachine(store)
        proposer = LocalProposer(fsm, clock, cfg.raft.address)
        service = Service(cfg, proposer, fsm, clock)
        service.create_queue("q", "fair", 1, 0, 60, {"max_messages": 0})
        for n in range(args.schedules):
            if args.cron:
                service.scheduler.put("q", f"s{n}", {"content": "x"}, cron="* * * * *",
                                      timezone="Europe/Berlin", catch_up="all")
            else:
                service.scheduler.put("q", f"s{n}", {"content": "x"}, every=1,
                                      catch_up="all")
        step = 60 if args.cron else 1
        cpu = time.process_time()
        planning = 0.0
        for _ in range(args.seconds):
            clock.t += step
            now = int(clock.t * 1000)
            started = time.process_time()
            for view in fsm.due_schedules(now):
                schedules.plan(view.defn, view.next_ms, now)
            planning += time.process_time() - started
            service.scheduler.round()
        cpu = time.process_time() - cpu - planning        # the rounds (they plan again)
        fired = service.scheduler.fired
        print(json.dumps({"schedules": args.schedules, "rounds": args.seconds,
                          "cron": args.cron, "fired": fired,
                          "us_per_occurrence": round(cpu / max(fired, 1) * 1e6, 1),
                          "plan_us_per_occurrence": round(planning / max(fired, 1) * 1e6, 1)}))
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
