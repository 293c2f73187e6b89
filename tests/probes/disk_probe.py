"""A full disk under a real cluster, inside a private mount namespace.

Run by tests/cluster/test_disk_full.py as ``unshare --mount -- python disk_probe.py DIR
SCENARIO``. Each node's data directory is a small tmpfs of its own; one of them is filled
until less than the reserve (``storage.min_free_bytes``) is left. Prints one JSON object with
what it observed.

Scenarios: ``single`` (one node), ``leader`` and ``follower`` (the disk of that node of three).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.harness import Cluster, Http, NodeProc, fill_disk, wait_until  # noqa: E402

DISK = 48 << 20                   # each node's tmpfs
RESERVE = 8 << 20                 # storage.min_free_bytes
LEFT = 2 << 20                    # free bytes left when the disk is "full"


def fill(node: NodeProc) -> str:
    """Take all but LEFT bytes of the node's disk (never all of it: the node writes too)."""
    return fill_disk(os.path.join(node.data_dir, node.node_id), LEFT)


def enqueue(http: Http, content: str) -> tuple[int, dict[str, Any]]:
    r = http.post("/API/v1/queues/q/messages", {"priority": 1, "content": content})
    return r.status, r.json()


def main() -> None:
    root, scenario = sys.argv[1], sys.argv[2]
    size = 1 if scenario == "single" else 3
    c = Cluster(root, size=size, flags={"storage.min_free_bytes": str(RESERVE)})
    for node in c.nodes:
        os.makedirs(os.path.join(root, node.node_id), exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs",
                        os.path.join(root, node.node_id)], check=True)
    out: dict[str, Any] = {}
    c.start()
    try:
        leader = c.leader()
        victim = leader if scenario in ("single", "leader") else c.followers()[0]
        others = [n for n in c.nodes if n is not victim]
        http = victim.http()
        assert http.post("/API/v1/queues", {"name": "q", "type": "delayed"}).status == 200
        acked = [enqueue(http, f"before {i}")[1]["id"] for i in range(20)]
        filler = fill(victim)
        time.sleep(1.0)                                  # the free space is read every 0.5 s
        status, body = enqueue(http, "refused")
        out["refused"] = [status, body.get("code"), body.get("errors", [{}])[0].get("message")]
        ready = victim.http().get("/readyz")
        out["readyz"] = [ready.status, ready.body.decode()[:300]]
        out["blocked_metric"] = victim.gauge("doq_storage_writes_blocked")
        out["free_metric"] = victim.gauge("doq_storage_free_bytes")
        got = http.get("/API/v1/queues/q/messages?ack=false")
        out["dequeue"] = got.status
        if got.status == 200:
            out["ack"] = http.post(f"/API/v1/queues/q/messages/{got.json()['id']}/ack").status
            acked.remove(got.json()["id"])
        if others:                              # the rest of the cluster, through another node
            other = others[0].http()
            status, body = enqueue(other, "through another node")
            out["other_node"] = [status, body.get("code")]
            if status == 200:
                acked.append(body["id"])
        os.remove(filler)
        wait_until(lambda: enqueue(http, "probe")[0] == 200, timeout=10)
        out["after_freeing"] = victim.http().get("/readyz").status
        out["blocked_after"] = victim.gauge("doq_storage_writes_blocked")
        c.assert_replicas_identical(timeout=30)
        left = []
        while True:
            r = http.get("/API/v1/queues/q/messages?ack=true")
            if r.status != 200:
                break
            left.append(r.json()["id"])
        out["acked_all_there"] = set(acked) <= set(left)
        out["alive"] = all(n.alive() for n in c.nodes)
    finally:
        c.stop()
        for node in c.nodes:
            subprocess.run(["umount", os.path.join(root, node.node_id)], capture_output=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
