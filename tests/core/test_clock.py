"""doq_lib/clock.py: the node's time moves with the monotonic clock and follows wall clock
jumps only by slewing (clock jumps)."""
from __future__ import annotations

from pathlib import Path

import pytest

from doq_lib.clock import SLEW_RATE, ManualClock, OffsetClock, SteadyClock, node_clock
from doq_lib.config import load_config


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def steady() -> tuple[SteadyClock, ManualClock, Monotonic]:
    wall, mono = ManualClock(1_800_000_000.0), Monotonic()
    return SteadyClock(wall, monotonic=mono), wall, mono


def advance(wall: ManualClock, mono: Monotonic, seconds: float) -> None:
    wall.advance(seconds)
    mono.now += seconds


def test_without_jumps_it_is_the_wall_clock() -> None:
    clock, wall, mono = steady()
    for _ in range(5):
        advance(wall, mono, 1.5)
        assert clock.now() == pytest.approx(wall.now())
        assert clock.offset == pytest.approx(0.0)


@pytest.mark.parametrize("jump", [3600.0, -3600.0])
def test_a_jump_of_an_hour_is_followed_one_percent_at_a_time(jump: float) -> None:
    clock, wall, mono = steady()
    before = clock.now()
    wall.advance(jump)                            # the wall clock jumps, no time passes
    assert clock.now() == pytest.approx(before)
    assert clock.offset == pytest.approx(jump)
    readings = []
    for _ in range(100):                          # 100 s pass, read every second
        advance(wall, mono, 1.0)
        readings.append(clock.now())
    assert readings == sorted(readings)           # never back, even after a backward jump
    assert readings[-1] - before == pytest.approx(100 + (1 if jump > 0 else -1) * SLEW_RATE
                                                  * 100)
    assert abs(clock.offset) == pytest.approx(3600 - 1.0)


def test_a_small_correction_is_absorbed() -> None:
    clock, wall, mono = steady()
    wall.advance(0.5)
    for _ in range(60):
        advance(wall, mono, 1.0)
        clock.now()
    assert clock.offset == pytest.approx(0.0)
    assert clock.now() == pytest.approx(wall.now())


def test_the_offset_clock_reads_its_file(tmp_path: Path) -> None:
    path = tmp_path / "offset"
    clock = OffsetClock(str(path), every=0.0)
    base = clock.now()
    path.write_text("3600")
    assert clock.now() - base == pytest.approx(3600, abs=1)
    path.write_text("garbage")
    assert clock.now() - base == pytest.approx(0, abs=1)


def test_the_node_clock_injects_an_offset_only_with_fault_injection(tmp_path: Path) -> None:
    path = str(tmp_path / "offset")
    assert isinstance(node_clock().source, type(SteadyClock().source))
    faults = load_config({}, {"DOQ_FAULTS_CLOCK_OFFSET_FILE": path}, None, str(tmp_path)).faults
    assert not faults.enabled
    assert not isinstance(node_clock(faults.clock_offset_file, faults.enabled).source,
                          OffsetClock)
    faults = load_config({}, {"DOQ_FAULTS_CLOCK_OFFSET_FILE": path, "DOQ_FAULTS_ENABLED": "1"},
                         None, str(tmp_path)).faults
    injected = node_clock(faults.clock_offset_file, faults.enabled)
    assert isinstance(injected.source, OffsetClock)
