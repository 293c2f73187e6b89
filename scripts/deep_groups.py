#!/usr/bin/env python3
"""What a fair group's depth costs a node: a node's resident memory
after messages with distinct groups one label deep, then the same number 16 labels deep
(the deepest a group may be; no label shared between groups), and after a restart (the
scheduler rebuilt from the store).

Before the fix, 100 messages with distinct 1,024-level groups took a node from 77 MB to
613 MB (every node of a path held the whole path), on every replica, surviving restart.
Such groups are refused now (422), and a group costs the scheduler at most two nodes
whatever its depth: the two figures per message should be close.

    python scripts/deep_groups.py --messages 20000

Bounded in count; loopback only; the node is stopped by the PID it started. Prints a
summary and a JSON line; exits 1 when 16-label groups cost more than 1.5 times 1-label ones
(plus 1 KiB a message), or a 1,024-level group is accepted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.harness import Cluster, Http, rss_kib  # noqa: E402


def settle(pid: int) -> int:
    """Resident memory once it stops moving (a few samples a second apart)."""
    last = -1
    for _ in range(10):
        now = rss_kib(pid)
        if abs(now - last) < 256:
            return now
        last = now
        time.sleep(1)
    return last


def fill(http: Http, queue: str, messages: int, depth: int) -> None:
    assert http.post("/API/v1/queues", {"name": queue, "type": "fair"}).status == 200
    for start in range(0, messages, 1000):
        batch = []
        for n in range(start, min(messages, start + 1000)):
            labels = [f"g{n}x{k}" for k in range(depth)]    # no label shared
            batch.append({"content": "x", "priority": 1, "group": ".".join(labels)})
        r = http.post(f"/API/v1/queues/{queue}/messages/batch", {"messages": batch})
        assert r.status == 200, r.body[:300]


def run(messages: int) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="doq-deep-groups-")
    cluster = Cluster(root, size=1).start()
    try:
        node = cluster.nodes[0]
        http = node.http(timeout=120)
        pid = node.proc.pid                                    # type: ignore[union-attr]
        start = settle(pid)
        fill(http, "shallow", messages, 1)
        shallow = settle(pid)
        fill(http, "deep", messages, 16)
        deep = settle(pid)
        refused = http.post("/API/v1/queues/deep/messages", {
            "content": "x", "priority": 1, "group": ".".join(["l"] * 1024)[:1023]}).status
        node.stop()
        node.start()
        cluster.wait_ready(120)
        pid = node.proc.pid                                    # type: ignore[union-attr]
        restarted = settle(pid)
        per_shallow = (shallow - start) / messages
        per_deep = (deep - shallow) / messages
        out = {"messages": messages, "rss_mib_start": round(start / 1024, 1),
               "rss_mib_after_1_label": round(shallow / 1024, 1),
               "rss_mib_after_16_labels": round(deep / 1024, 1),
               "rss_mib_after_restart": round(restarted / 1024, 1),
               "kib_per_message_1_label": round(per_shallow, 2),
               "kib_per_message_16_labels": round(per_deep, 2),
               "1024_levels_answer": refused}
        out["ok"] = bool(refused == 422 and per_deep <= 1.5 * per_shallow + 1.0)
        return out
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    out = run(min(args.messages, 1_000_000))
    for key, value in out.items():
        print(f"{key}: {value}")
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
