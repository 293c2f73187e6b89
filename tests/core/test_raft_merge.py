"""Merged entries (doq_lib/raft/tick.py): the leader puts the batches every node proposed
since its last tick into one log entry; each proposer still gets exactly its own results and
every replica applies the same thing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from doq_lib.raft.pipeline import EntryResult
from tests.harness import REPO


def _probe(tmp_path: Any, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "probes", "merge_probe.py"), str(tmp_path),
         *args], capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_batches_of_three_proposers_share_entries_and_get_their_own_results(
        tmp_path: Any) -> None:
    result = _probe(tmp_path, "60")
    assert result["answered"] == result["batches"] == 180 and result["errors"] == []
    assert result["own_results"] is True
    assert result["entries"] < result["batches"], "concurrent batches share log entries"
    assert result["merged_entries"] > 0, "entries of several batches are MERGED entries"
    assert len(set(result["digests"])) == 1 and len(set(result["applied"])) == 1


@pytest.mark.slow
def test_the_leader_appends_while_fewer_than_pipeline_entries_wait(tmp_path: Any) -> None:
    """raft.pipeline_entries: the leader appends an entry only while fewer than that many of
    its entries wait for their commit (what arrives meanwhile joins the next entry); the
    default 1 and a huge value both answer every batch with its own results."""
    one = _probe(tmp_path / "one", "60")                      # the default: 1
    assert one["answered"] == one["batches"] == 180 and one["own_results"] is True
    assert one["most_uncommitted"] == 0, "appended only once the entry before committed"
    huge = _probe(tmp_path / "huge", "60", f"pipeline={2 ** 62}")
    assert huge["answered"] == huge["batches"] == 180 and huge["own_results"] is True
    assert len(set(huge["digests"])) == 1
    two = _probe(tmp_path / "two", "60", "pipeline=2")
    assert two["answered"] == 180 and two["most_uncommitted"] <= 1


def test_the_probe_notices_results_that_are_not_the_batchs_own(tmp_path: Any) -> None:
    result = _probe(tmp_path, "20", "unsliced")
    assert result["answered"] == result["batches"] == 60
    assert result["own_results"] is False


def test_entry_results_are_sliced_by_batch_id() -> None:
    results = [(0, "a"), (0, "b"), (0, "c"), (0, "d")]
    merged = EntryResult([("x", 0, 1), ("y", 1, 3)])
    assert merged.part("x", results) == [(0, "a")]
    assert merged.part("y", results) == [(0, "b"), (0, "c"), (0, "d")]
    assert merged.part("z", results) is None, "a batch not in the entry gets no results"
    assert merged.part("x", None) is None
    assert EntryResult().part("any", results) == results, "an entry of one batch: all of it"
