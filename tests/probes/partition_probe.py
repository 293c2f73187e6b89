"""Network partitions of a real 3-node cluster, inside a private network namespace.

Run by tests/cluster/test_partition.py as
``unshare --net -- python partition_probe.py DIR SCENARIO``.
Nodes live on 127.0.0.11-13 and Raft connections leave from each node's own address, so
iptables rules between those addresses cut the cluster while the probe (from 127.0.0.1) can
still talk to every node. Prints one JSON object with what it observed.

Scenarios: ``leader`` (isolate the leader), ``follower`` (isolate one follower).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.harness import Cluster, NodeProc, wait_until  # noqa: E402

HOSTS = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


def isolate(node: NodeProc, others: list[NodeProc]) -> None:
    for other in others:
        for src, dst in ((node.host, other.host), (other.host, node.host)):
            sh("iptables", "-A", "INPUT", "-s", src, "-d", dst, "-j", "DROP")


def heal() -> None:
    sh("iptables", "-F", "INPUT")


def write(node: NodeProc, content: str) -> int:
    try:
        return node.http(timeout=20).post("/API/v1/queues/p/messages",
                                          {"content": content, "priority": 1}).status
    except OSError:
        return -1


def role(node: NodeProc) -> str:
    return str(node.status()["raft"]["state"])


def _agreed_leader(c: Cluster) -> str | None:
    """The node id every node names as its leader, if they all agree and it leads."""
    leaders = {n.status()["raft"]["leader"] for n in c.nodes}
    if len(leaders) != 1 or None in leaders:
        return None
    (addr,) = leaders
    node = next((n for n in c.nodes if n.raft_addr == addr), None)
    return node.node_id if node is not None and role(node) == "leader" else None


def scenario(c: Cluster, isolate_leader: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    leader = c.leader()
    assert leader.http().post("/API/v1/queues", {"name": "p", "type": "delayed"}).status == 200
    assert write(leader, "before") == 200
    victim = leader if isolate_leader else c.followers()[0]
    majority = [n for n in c.nodes if n is not victim]
    isolate(victim, majority)
    cut = time.monotonic()
    out["minority_writes"] = [write(victim, f"minority-{i}") for i in range(2)]
    new_leader = wait_until(lambda: next((n for n in majority if role(n) == "leader"), None), 20)
    out["majority_has_leader_after_s"] = round(time.monotonic() - cut, 2)
    out["majority_writes"] = [write(n, f"majority-{n.node_id}") for n in majority]
    out["victim_role_during_partition"] = role(victim)
    out["victim_ready_during_partition"] = victim.ready()
    heal()
    wait_until(lambda: role(victim) == "follower" and victim.ready(), 30)
    # The cut-off node kept starting elections, so its term is higher than the others': when
    # it is heard again the leader steps down and the cluster elects again (PySyncObj has no
    # pre-vote). That is allowed; what must hold is one leader that every node follows.
    wait_until(lambda: _agreed_leader(c) is not None, 30)
    out["leaders_after_heal"] = sorted(n.node_id for n in c.nodes if role(n) == "leader")
    out["agreed_leader"] = _agreed_leader(c)
    out["new_leader"] = new_leader.node_id
    states = c.assert_replicas_identical(timeout=30)
    out["replicas_identical"] = len({s["digest"] for s in states}) == 1
    contents = []
    http = new_leader.http()
    while (r := http.get("/API/v1/queues/p/messages?ack=true")).status == 200:
        contents.append(r.json()["content"])

    out["contents"] = contents
    return out


def main() -> None:
    root, which = sys.argv[1], sys.argv[2]
    sh("ip", "link", "set", "lo", "up")
    c = Cluster(root, size=3, hosts=HOSTS).start()
    try:
        result = scenario(c, isolate_leader=(which == "leader"))
    finally:
        heal()
        c.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
