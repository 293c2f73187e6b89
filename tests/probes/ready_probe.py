"""A restarted leader whose store is rebuilt from the journal must not call itself caught up
before it has applied every acknowledged write.

Usage: ready_probe.py DIR

A one-node cluster (in this gevent process) commits a queue and 40 enqueues, one entry each,
and stops. Then, as a kill -9 during a system crash leaves it: the journal's meta keeps an
old commit index (it is stored lazily, once a second) and the store is gone (an untrusted
store is wiped and rebuilt from the journal). The node restarts with its journal syncs
started 300 ms late, so its first commit of the new term (PySyncObj's no-op) waits that
long. Meanwhile the probe watches, every millisecond, whether the node says it is ready
(PySyncObj's ``isReady``) and caught up (``RaftNode.caught_up``, what ``/readyz`` asks) while
its state machine has not yet applied every enqueue.

Prints one JSON line: how many samples saw ``isReady`` true while writes were missing (the
window the old readiness had), how many saw ``caught_up`` true then (must be 0), and the
messages the queue holds in the end (must be 40).
"""
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from doq_lib import commands as C  # noqa: E402
from doq_lib.config import load_config  # noqa: E402
from doq_lib.fsm import StateMachine  # noqa: E402
from doq_lib.lmdb_store import LmdbStore  # noqa: E402
from doq_lib.raft.durability import DurableJournal  # noqa: E402
from doq_lib.raft.node import RaftNode  # noqa: E402
from tests.harness import free_ports  # noqa: E402
from tests.probes.local_raft import create_queue  # noqa: E402

MESSAGES = 40


def start(root: str, addr: str, wipe: bool = False) -> RaftNode:
    cfg = load_config({"cluster.node_id": "n0", "raft.address": addr, "cluster.peers": addr,
                       "storage.data_dir": root}, {}, None, root)
    os.makedirs(cfg.node_dir, exist_ok=True)
    store = LmdbStore(os.path.join(cfg.node_dir, "store"))
    if wipe:
        store.wipe()
    node = RaftNode(cfg, store, StateMachine(store))
    node.start()
    return node


def main() -> None:
    root = sys.argv[1]
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    node = start(root, addr)
    deadline = time.monotonic() + 20
    while not node.is_leader:
        assert time.monotonic() < deadline, "no leader"
        gevent.sleep(0.02)
    create_queue(node, "q")
    done: list[int] = []
    for k in range(MESSAGES):                         # one entry each
        node.propose([(C.ENQUEUE, "q", 0, "", k, f"m{k}", None)], int(time.time() * 1000),
                     lambda res, err: done.append(err))
        while len(done) <= k:
            gevent.sleep(0.001)
    assert done == [0] * MESSAGES, done
    last = node.doq_journal[-1][1]
    meta_path = node.doq_journal._meta_path
    node.stop()
    node.fsm.store.close()

    # What a kill -9 in a system crash leaves: an old commit index, a store to rebuild.
    with open(meta_path, "rb") as f:
        meta = pickle.loads(f.read())
    meta["raftCommitIndex"] = 2
    with open(meta_path, "wb") as f:
        f.write(pickle.dumps(meta, protocol=5))

    original = DurableJournal.__init__

    def late_syncs(self: DurableJournal, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)                 # type: ignore[arg-type]
        background = self._background
        if background is not None:
            self._background = lambda fn, a, done: gevent.spawn_later(
                0.3, background, fn, a, done)
    DurableJournal.__init__ = late_syncs                # type: ignore[method-assign]

    node = start(root, addr, wipe=True)
    ready_behind = caught_up_behind = samples = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        behind = node.fsm.applied_index < last or not node.pipeline.idle
        if behind:
            samples += 1
            ready_behind += bool(node.isReady())
            caught_up_behind += bool(node.caught_up())
        elif node.caught_up():
            break
        gevent.sleep(0.001)
    queue = node.fsm.queues.get("q")
    ready = queue.index.ready if queue is not None else None
    print(json.dumps({"samples_behind": samples, "ready_while_behind": ready_behind,
                      "caught_up_while_behind": caught_up_behind,
                      "caught_up": node.caught_up(), "applied": node.fsm.applied_index,
                      "last": last, "ready": ready}))
    sys.stdout.flush()
    node.stop()


if __name__ == "__main__":
    main()
