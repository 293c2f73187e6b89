"""Three Raft nodes in one gevent process; all three propose batches at once, so the leader
merges them into shared log entries (doq_lib/raft/tick.py).

Usage: merge_probe.py DIR BATCHES_PER_NODE [unsliced | pipeline=N]

``unsliced`` hands every proposer the whole entry's results (as if merged entries had no
per-batch results), to show that the probe notices; ``pipeline=N`` sets
``raft.pipeline_entries``. The leader's log records, at each entry it appends, how many of its
entries were still waiting for their commit (``most_uncommitted``: at most N).

Each batch enqueues three messages whose contents name the batch; every proposer records the
results it got back. Prints one JSON line: batches proposed and answered, log entries used,
whether every batch got exactly its own results (ids of messages whose stored content names
that batch), and the replicas' digests.
"""
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from doq_lib import commands as C  # noqa: E402
from doq_lib.raft import tick  # noqa: E402
from doq_lib.raft.node import RaftNode  # noqa: E402
from doq_lib.store import U64, decode_message  # noqa: E402
from tests.probes.local_raft import create_queue, leader_of, start_nodes  # noqa: E402


def main() -> None:
    root, per_node = sys.argv[1], int(sys.argv[2])
    flags: dict[str, str] = {}
    if sys.argv[3:] == ["unsliced"]:
        from doq_lib.raft.pipeline import EntryResult
        EntryResult.part = lambda self, batch_id, results: results   # type: ignore[method-assign]
    elif sys.argv[3:4] and sys.argv[3].startswith("pipeline="):
        flags["raft.pipeline_entries"] = sys.argv[3].split("=", 1)[1]
    nodes: list[RaftNode] = start_nodes(root, flags=flags)
    leader = leader_of(nodes)
    create_queue(leader)
    uncommitted: list[int] = []
    log = leader.raft.log
    plain_add = log.add

    def add(command: bytes, index: int, term: int) -> None:
        uncommitted.append(index - 1 - leader.raft.commit_index)
        plain_add(command, index, term)
    log.add = add
    deadline = time.time() + 20
    answers: dict[str, list[tuple[int, object]]] = {}
    errors: list[int] = []
    entries_before = leader.raftCommitIndex

    def proposer(node: RaftNode, n: int) -> None:
        inflight: list[int] = [0]
        for k in range(per_node):
            while inflight[0] >= 4:
                gevent.sleep(0.001)
            name = f"n{n}-b{k}"
            ops = [(C.ENQUEUE, "q", 0, "", 1, f"{name}-m{j}", None) for j in range(3)]

            def done(res: object, err: int, name: str = name) -> None:
                if err != 0 or res is None:
                    errors.append(err)
                    inflight[0] -= 1
                    return

                def got(results: object) -> None:
                    answers[name] = res.part(node_bid[name], results)  # type: ignore[union-attr]
                    inflight[0] -= 1
                res.add_callback(got)                               # type: ignore[attr-defined]
            bid = f"probe-{name}"
            node_bid[name] = bid
            inflight[0] += 1
            node.propose(ops, int(time.time() * 1000), done, 0, bid)

    node_bid: dict[str, str] = {}
    workers = [gevent.spawn(proposer, node, n) for n, node in enumerate(nodes)]
    gevent.joinall(workers, timeout=60)
    while len(answers) + len(errors) < 3 * per_node and time.time() < deadline + 60:
        gevent.sleep(0.05)
    gevent.sleep(0.5)
    # Every answer must be the batch's own: the ids it got hold the contents that name it.
    qs = nodes[0].fsm.queues["q"]
    own = len(answers) == 3 * per_node
    ids: set[int] = set()
    with nodes[0].fsm.store.read() as txn:
        for name, results in answers.items():
            if results is None or len(results) != 3 or any(code != 0 for code, _ in results):
                own = False
                continue
            for j, (_, value) in enumerate(results):
                mid = value[0]                                  # type: ignore[index]
                ids.add(mid)
                raw = txn.get("messages", qs.prefix + U64.pack(mid))
                if raw is None or decode_message(raw)[2] != f"{name}-m{j}":
                    own = False
    print(json.dumps({
        "batches": 3 * per_node,
        "answered": len(answers),
        "errors": errors,
        "entries": leader.raftCommitIndex - entries_before,
        "own_results": own and len(ids) == 9 * per_node,
        "merged_entries": sum(1 for e in leader.doq_journal if e[0][:1] == tick.MERGED),
        "most_uncommitted": max(uncommitted, default=0),
        "digests": [n.fsm.store.digest(include_meta=False) for n in nodes],
        "applied": [n.fsm.applied_index for n in nodes],
    }))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
