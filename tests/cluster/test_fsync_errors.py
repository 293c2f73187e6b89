"""A failed journal sync or write: fail-stop. After an fdatasync error the kernel
may have dropped the pages and marked them clean, so no later sync can vouch for those
entries; after a failed write what is on disk is not what the node holds. Either way the node
stops at once, says so in its log, and never acknowledges them. The rest of the cluster goes
on and nothing acknowledged is lost; restarted, the node catches up. The errors are injected
under DOQ_FAULTS_ENABLED=1: while DOQ_FAULTS_FAIL_FSYNC_FILE exists every journal sync of the node
counts as failed; while DOQ_FAULTS_FAIL_WRITE_FILE exists every journal write (append, truncation,
compaction, term and vote) raises EIO. Below the cluster, the journal itself: a write that
raises or comes back short stops the process and the journal reads back whole."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest

from doq_lib.raft.durability import DurableJournal
from tests.harness import REPO, Cluster, Http, fault_file, injectable, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture()
def cluster(tmp_path: object) -> Iterator[Cluster]:
    with injectable(str(tmp_path)) as c:
        yield c


FAULTS = {"sync": ("DOQ_FAULTS_FAIL_FSYNC_FILE", "fdatasync failed"),
          "write": ("DOQ_FAULTS_FAIL_WRITE_FILE", "append failed")}


def enqueue(http: Http, content: str) -> int:
    r = http.post("/API/v1/queues/q/messages", {"priority": 1, "content": content})
    assert r.status == 200, r.body
    return int(r.json()["id"])


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("role", ["follower", "leader"])
def test_a_failed_sync_or_write_stops_the_node_and_loses_nothing(
        cluster: Cluster, role: str, fault: str) -> None:
    variable, said = FAULTS[fault]
    leader = cluster.leader()
    victim = leader if role == "leader" else cluster.followers()[0]
    others = [n for n in cluster.nodes if n is not victim]
    http = others[0].http()
    assert http.post("/API/v1/queues", {"name": "q", "type": "delayed"}).status == 200
    acked = [enqueue(http, f"before {i}") for i in range(10)]
    open(fault_file(victim, variable), "w").close()
    # the next write makes every node append and sync; the victim's append or sync fails
    try:
        acked.append(enqueue(http, "the write that meets the failure"))
    except AssertionError:
        pass                                   # through a dying leader: no answer, no ack
    wait_until(lambda: not victim.alive(), timeout=15, describe=victim.tail)
    assert victim.proc is not None and victim.proc.returncode == 71
    assert said in victim.tail(40) and "fail-stop" in victim.tail(40), victim.tail(40)
    # A leader among the survivors first: just after the victim died, a follower still reads
    # ready (it heard from that leader within the last half second) until its election
    # starts, and a write then finds no leader.
    cluster.leader(timeout=20)
    survivor = Http(others[0].http_port, timeout=15)
    wait_until(lambda: survivor.get("/readyz").status == 200, timeout=20)
    acked += [enqueue(survivor, f"after {i}") for i in range(5)]
    os.remove(fault_file(victim, variable))
    victim.start()
    wait_until(victim.ready, timeout=30, describe=victim.tail)
    cluster.assert_replicas_identical(timeout=30)
    got = []
    while (r := survivor.get("/API/v1/queues/q/messages?ack=true")).status == 200:
        got.append(int(r.json()["id"]))
        assert len(got) < 100
    assert set(acked) <= set(got), set(acked) - set(got)


JOURNAL_SCRIPT = """
import os, sys
from doq_lib.raft.durability import DurableJournal
path, mode = sys.argv[1], sys.argv[2]
j = DurableJournal(path)
if mode == "fill":
    for i in range(1, 6):
        j.add(b"entry %d" % i, i, 1)
    j.sync_now()
    sys.exit(0)
if mode == "eio":
    j.write_fails = lambda: True
elif mode == "short":
    real = os.pwrite
    os.pwrite = lambda fd, data, at: real(fd, data[:len(data) // 2], at)
j.add(b"entry 6", 6, 1)
print("went on after a failed write")
"""


@pytest.mark.parametrize("mode", ["eio", "short"])
def test_a_journal_write_that_fails_or_comes_back_short_stops_the_process(
        tmp_path: object, mode: str) -> None:
    path = os.path.join(str(tmp_path), "journal.bin")

    def run(step: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", JOURNAL_SCRIPT, path, step], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    assert run("fill").returncode == 0
    done = run(mode)
    assert done.returncode == 71, (done.stdout, done.stderr)
    assert "went on" not in done.stdout
    assert "append failed" in done.stderr and "fail-stop" in done.stderr, done.stderr
    if mode == "short":
        assert "short write" in done.stderr
    # read back: the five synced entries, and no trace of the torn sixth
    again = DurableJournal(path)
    assert [(e[0], e[1]) for e in again] == [(b"entry %d" % i, i) for i in range(1, 6)]
    again._destroy()
