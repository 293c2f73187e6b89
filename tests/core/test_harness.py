"""The harness's safety net: a node whose state machine failed on an operation fails the test
that ran it (doq_lib/fsm/machine.py logs such failures; bad input must be refused before it
is proposed), unless the node injects faults on purpose."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from doq_lib.fsm import machine
from tests.harness import STATE_MACHINE_FAILURE, NodeProc

LINES = [
    "2026-12-02 ERROR operation enqueue failed at entry 41; rolled back: enqueue(queue='q')",
    "2026-12-02 ERROR applying entries 40..44 failed; isolating operations",
]


def node_with_log(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> NodeProc:
    node = NodeProc("n", 1, 2, str(tmp_path), [], env=env or {})
    Path(node.log_path).write_text(text)
    return node


@pytest.mark.parametrize("line", LINES)
def test_a_state_machine_failure_in_the_log_fails_the_test(tmp_path: Path, line: str) -> None:
    node = node_with_log(tmp_path, f"started\n{line}\nstopped\n")
    with pytest.raises(AssertionError, match="the state machine failed on an operation"):
        node.check_log()


def test_a_clean_log_or_deliberate_faults_pass(tmp_path: Path) -> None:
    node_with_log(tmp_path, "started\nstopped\n").check_log()
    node_with_log(tmp_path, "\n".join(LINES), {"DOQ_FAULTS_ENABLED": "1"}).check_log()


def test_the_pattern_matches_what_the_state_machine_logs() -> None:
    source = inspect.getsource(machine)
    assert '"operation %s failed at entry %d; rolled back: %s"' in source
    assert '"applying entries %d..%d failed; isolating operations"' in source
    for line in LINES:
        assert STATE_MACHINE_FAILURE.search(line)
