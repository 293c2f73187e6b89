"""Schedules: when they fire (cron in time zones across daylight saving time, every N
seconds, start and end, lateness and catch_up), and as replicated state in process: each
occurrence stored once whatever is proposed twice, pauses, restarts, queue deletion,
backups, the bounds of every accepted value."""
from __future__ import annotations

import datetime as dt
import itertools
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from croniter import CroniterBadDateError, croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doq_lib import commands as C
from doq_lib import schedules as S
from doq_lib.errors import InvalidArgument, QueueNotFound, ScheduleNotFound
from tests.conftest import FixedClock, LocalNode, local_node

BERLIN = "Europe/Berlin"
T0 = 1_700_000_000.0            # 2023-11-14T22:13:20Z


def utc(*args: int) -> int:
    return int(dt.datetime(*args, tzinfo=dt.timezone.utc).timestamp() * 1000)


def first(defn: S.Definition, after_ms: int, n: int) -> list[str]:
    return [S.iso(at) for at in itertools.islice(S.occurrences(defn, after_ms), n)]


def cron(expr: str, tz: str = "", **kw: Any) -> S.Definition:
    return S.define("c", {"content": "x"}, 0, cron=expr, timezone=tz, **kw)


# -- when it fires ----------------------------------------------------------------------------

def test_a_wall_time_in_the_spring_gap_fires_once_past_the_gap() -> None:
    # Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day
    assert first(cron("30 2 * * *", BERLIN), utc(2026, 3, 27), 4) == [
        "2026-03-27T01:30:00Z", "2026-03-28T01:30:00Z",
        "2026-03-29T01:30:00Z",           # 03:30 CEST: as far past the gap as 02:30 was in it
        "2026-03-30T00:30:00Z"]           # 02:30 CEST


def test_a_repeated_wall_time_in_autumn_fires_once_at_its_first_instance() -> None:
    # Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice
    assert first(cron("30 2 * * *", BERLIN), utc(2026, 10, 24, 1), 3) == [
        "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z", "2026-10-27T01:30:00Z"]
    # half-hourly: the repeated hour's wall times fire once each, then it goes on in CET
    assert first(cron("0,30 * * * *", BERLIN), utc(2026, 10, 24, 23, 0), 6) == [
        "2026-10-24T23:30:00Z", "2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z",
        "2026-10-25T02:00:00Z", "2026-10-25T02:30:00Z", "2026-10-25T03:00:00Z"]


def test_the_spring_gap_never_fires_one_instant_twice() -> None:
    # 02:00 and 03:00 both land on 03:00 CEST, 02:30 and 03:30 on 03:30 CEST
    got = first(cron("0,30 2,3,4 * * *", BERLIN), utc(2026, 3, 28, 23), 6)
    assert got == ["2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z", "2026-03-29T02:00:00Z",
                   "2026-03-29T02:30:00Z", "2026-03-30T00:00:00Z", "2026-03-30T00:30:00Z"]
    assert len(set(got)) == len(got)


def test_utc_and_other_zones_have_no_gap() -> None:
    assert first(cron("0 2 * * *"), utc(2026, 3, 28, 3), 2) == [
        "2026-03-29T02:00:00Z", "2026-03-30T02:00:00Z"]
    assert first(cron("0 9 * * 1", "America/New_York"), utc(2026, 11, 1), 2) == [
        "2026-11-02T14:00:00Z", "2026-11-09T14:00:00Z"]
    assert first(cron("@daily", "Asia/Kolkata"), utc(2026, 1, 1), 1) == ["2026-01-01T18:30:00Z"]


def test_every_counts_from_its_start_and_stops_at_its_end() -> None:
    start = 1_800_000_000
    defn = S.define("e", {"content": "x"}, 0, every=90, start_at=start, end_at=start + 300)
    assert list(S.occurrences(defn, 0)) == [(start + n * 90) * 1000 for n in range(4)]
    assert S.next_after(defn, (start + 300) * 1000) == 0
    # without a start: from its creation, rounded up to the second
    defn = S.define("e", {"content": "x"}, 1_700_000_000_250, every=5)
    assert list(itertools.islice(S.occurrences(defn, 1_700_000_000_250), 2)) == [
        1_700_000_001_000, 1_700_000_006_000]


def test_cron_start_and_end_bound_it() -> None:
    defn = cron("0 * * * *", start_at=utc(2026, 1, 1, 5) // 1000,
                end_at=utc(2026, 1, 1, 7) // 1000)
    assert first(defn, 0, 5) == ["2026-01-01T05:00:00Z", "2026-01-01T06:00:00Z",
                                 "2026-01-01T07:00:00Z"]


@pytest.mark.parametrize("catch_up, fired, skipped", [
    ("all", list(range(1, 100, 10)), 0),
    ("one", [31] + list(range(41, 100, 10)), 3),
    ("none", list(range(41, 100, 10)), 4),
])
def test_catch_up_decides_only_what_was_missed(catch_up: str, fired: list[int],
                                               skipped: int) -> None:
    base = 1_700_000_000_000
    defn = S.define("e", {"content": "x"}, base + 500, every=10, catch_up=catch_up, grace=60)
    plan = S.plan(defn, base + 1000, base + 100_000)     # 99 s late; 60 s are on time
    assert plan is not None
    assert [(at - base) // 1000 for at in plan.fired] == fired
    assert (plan.skipped, plan.next_ms, plan.after) == (skipped, base + 101_000, base + 1000)
    assert S.plan(defn, base + 101_000, base + 100_000) is None         # not due yet


def test_catch_up_all_fires_a_long_backlog_in_bounded_steps() -> None:
    defn = S.define("e", {"content": "x"}, 0, every=1, catch_up="all")
    plan = S.plan(defn, 1000, 5_000_000)
    assert plan is not None and len(plan.fired) == S.MAX_FIRED
    assert plan.next_ms == (S.MAX_FIRED + 1) * 1000


def test_catch_up_one_after_a_year_down_is_quick() -> None:
    defn = cron("* * * * *", BERLIN, catch_up="one")
    plan = S.plan(defn, utc(2025, 1, 1), utc(2026, 1, 1))
    assert plan is not None
    assert [S.iso(a) for a in plan.fired] == ["2025-12-31T23:58:00Z", "2025-12-31T23:59:00Z",
                                              "2026-01-01T00:00:00Z"]
    # missed: Berlin's wall clock from 01:00 on 1 January 2025 to 00:58 on 1 January 2026
    # (a year of minutes less one; its one-hour gap and repeat count as the clock shows
    # them), less the one that catch_up fires
    assert plan.skipped == 365 * 1440 - 1 - 1


# -- counting what was missed: arithmetic, checked against croniter's own walk ---------------
_FIELDS = st.tuples(
    st.sampled_from(["*", "0", "*/5", "7,31", "10-20/3", "59"]),
    st.sampled_from(["*", "0", "2", "8-17", "*/6", "1,13,23"]),
    st.sampled_from(["*", "1", "15", "L", "29", "1-7", "15W", "31", "10-20/2"]),
    st.sampled_from(["*", "2", "1,7", "*/3", "12"]),
    st.sampled_from(["*", "0", "1-5", "6,0", "5#2", "1L", "7"]))
_ZONES = st.sampled_from(["UTC", BERLIN, "America/New_York", "Australia/Lord_Howe",
                          "Asia/Kathmandu"])


def _walked(expr: str, tz: Any, first_ms: int, last_ms: int) -> int:
    """Occurrences on the wall clock between two instants, by croniter's own steps."""
    start = dt.datetime.fromtimestamp(first_ms / 1000, tz).replace(tzinfo=None)
    end = dt.datetime.fromtimestamp(last_ms / 1000, tz).replace(tzinfo=None)
    it, count = croniter(expr, start - dt.timedelta(microseconds=1)), 0
    while count < 200_000:
        try:
            at = it.get_next(dt.datetime)
        except CroniterBadDateError:
            break
        if at > end:
            break
        count += 1
    return count


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=_FIELDS, zone=_ZONES, start=st.integers(0, 30 * 365 * 86_400_000),
       span=st.integers(0, 40 * 86_400_000))
def test_missed_occurrences_are_counted_as_croniter_walks_them(
        fields: tuple[str, ...], zone: str, start: int, span: int) -> None:
    expr = " ".join(fields)
    try:
        S.check_cron(expr)
    except S.ScheduleError:
        return                                           # (never matches: refused anyway)
    tz = S.zone(zone)
    first_ms = 1_000_000_000_000 + start
    assert S.count_cron(expr, tz, first_ms, first_ms + span) == \
        _walked(expr, tz, first_ms, first_ms + span)


@pytest.mark.parametrize("expr, years, expected", [
    ("* * * * *", (2025, 2026), 365 * 1440),
    ("0 0 29 2 *", (2000, 2400), 97),                 # the leap days of one cycle
    ("0 0 29 2 *", (1980, 9980), 20 * 97),            # twenty cycles, counted not walked
    ("30 2 1 * 1", (2001, 2401), None),               # compared with a walk below
])
def test_long_spans_are_counted_by_years_and_cycles(expr: str, years: tuple[int, int],
                                                    expected: int | None) -> None:
    first_ms, last_ms = utc(years[0], 1, 1), utc(years[1], 1, 1) - 1
    counted = S.count_cron(expr, S.zone("UTC"), first_ms, last_ms)
    if expected is None:
        expected = _walked(expr, dt.timezone.utc, first_ms, last_ms)
    assert counted == expected


def test_planning_a_missed_schedule_costs_the_same_after_an_hour_or_a_century() -> None:
    """The steps croniter takes to plan one missed schedule do not grow with how long it
    was missed (counted, not timed)."""
    steps = {}
    real = croniter.get_next, croniter.get_prev
    calls = [0]

    def counting(method: Any) -> Any:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return method(self, *args, **kwargs)
        return step

    now = utc(2026, 6, 3, 12)                 # a Wednesday
    day = 86_400_000
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(croniter, "get_next", counting(real[0]))
        patch.setattr(croniter, "get_prev", counting(real[1]))
        for expr, tz in (("* * * * *", "UTC"), ("*/5 8-17 * * 1-5", BERLIN),
                         ("0 3 L * *", "America/New_York")):
            defn = cron(expr, tz, catch_up="one")
            S.plan(defn, S.next_after(defn, now - 50 * 365 * 86_400_000), now)   # warm
            for missed_ms in (40 * day, 400 * day, 50 * 365 * day):
                calls[0] = 0
                assert S.plan(defn, S.next_after(defn, now - missed_ms), now) is not None
                steps[(expr, missed_ms)] = calls[0]
            assert steps[(expr, 40 * day)] == steps[(expr, 50 * 365 * day)] <= 8, steps


# -- what is refused --------------------------------------------------------------------------

@pytest.mark.parametrize("expr, says", [
    ("* * *", "five fields"), ("* * * * * *", "five fields"), ("* * * * * * *", "five fields"),
    ("61 * * * *", "not a cron"), ("*/0 * * * *", "not a cron"), ("0 0 30 2 *", "never"),
    ("hello world how are you", "not a cron"), ("R * * * *", "random"),
    ("H * * * *", "random"), ("0 H(0-5) * * *", "random"), ("@reboot", "alias"),
    ("@every 5m", "alias"), ("", "either"), ("0 0 * * 8", "not a cron"),
    ("\u00e9 * * * *", "ASCII"), ("* * * * *\n", "ASCII"), ("1" * 201, "at most"),
])
def test_what_is_not_cron_is_refused(expr: str, says: str) -> None:
    with pytest.raises(S.ScheduleError, match=says):
        cron(expr)


@pytest.mark.parametrize("kw, field", [
    ({"every": 0}, "every"), ({"every": S.MAX_EVERY + 1}, "every"), ({"every": 1.5}, "every"),
    ({"every": True}, "every"), ({"every": 5, "cron": "* * * * *"}, "cron"),
    ({"every": 5, "timezone": "UTC"}, "timezone"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
    ({"cron": "* * * * *", "timezone": "../../etc/passwd"}, "timezone"),
    ({"cron": "* * * * *", "timezone": "/etc/localtime"}, "timezone"),
    ({"every": 5, "start_at": -1}, "start_at"), ({"every": 5, "start_at": S.MAX_TIME + 1},
                                                 "start_at"),
    ({"every": 5, "start_at": 100, "end_at": 99}, "end_at"),
    ({"every": 5, "catch_up": "some"}, "catch_up"), ({"every": 5, "grace": 0}, "grace"),
    ({"every": 5, "grace": S.MAX_GRACE + 1}, "grace"),
])
def test_bad_definitions_name_their_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(S.ScheduleError) as caught:
        S.define("s", {"content": "x"}, 0, **kw)
    assert caught.value.field == field


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 201, "naïve", "a/b"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(S.ScheduleError, match="name"):
        S.define(name, {"content": "x"}, 0, every=5)


def test_the_bounds_of_every_accepted_value_can_be_computed_with() -> None:
    """The extremes that validation accepts plan, fire and end without an error."""
    far = S.define("e", {"content": "x"}, 0, every=S.MAX_EVERY, start_at=S.MAX_TIME - 10)
    assert S.next_after(far, 0) == (S.MAX_TIME - 10) * 1000
    assert S.next_after(far, (S.MAX_TIME - 10) * 1000) == 0        # past year 9999: ended
    late = cron("59 23 31 12 *", "Pacific/Kiritimati", start_at=S.MAX_TIME - 86400 * 400)
    assert S.occurrences(late, 0) is not None
    assert len(list(itertools.islice(S.occurrences(late, 0), 5))) <= 2
    leap = cron("0 0 29 2 *", "Pacific/Chatham")
    assert first(leap, utc(2026, 1, 1), 1) == ["2028-02-28T10:15:00Z"]   # +13:45 in summer
    tiny = S.define("e", {"content": "x"}, 0, every=1, grace=1, catch_up="none")
    assert S.plan(tiny, 1000, S.MAX_TIME * 1000) is not None
    assert S.plan(far, (S.MAX_TIME - 10) * 1000, S.MAX_TIME * 1000) == S.Plan(
        (S.MAX_TIME - 10) * 1000, [(S.MAX_TIME - 10) * 1000], 0, 0)


# -- replicated state, in process --------------------------------------------------------------

@pytest.fixture
def node(tmp_path: Path) -> Iterator[LocalNode]:
    n = local_node(tmp_path / "store", FixedClock(T0))
    n.service.create_queue("q", "fair", 1, 0, 60)
    yield n
    n.close()


def drain(node: LocalNode, queue: str = "q") -> list[dict[str, str]]:
    out = []
    for _ in range(10_000):
        taken = node.service.take(queue, True, 100, 0.0, None, "")
        if not taken:
            return out
        out.extend(m.metadata for m in taken)
    raise AssertionError("more than a million messages")


def advance(node: LocalNode, seconds: float, step: float = 1.0) -> None:
    """Move the clock on by ``seconds`` in steps, with a scheduler round after each."""
    for _ in range(int(seconds / step)):
        node.clock.t += step
        for _ in range(100):
            if node.service.scheduler.round() > 0:
                break


def test_every_second_fires_each_occurrence_once_with_its_metadata(node: LocalNode) -> None:
    status, view = node.service.scheduler.put("q", "tick", {"content": "hi", "group": "g",
                                                            "metadata": {"k": "v"}}, every=1)
    assert status == "created" and view.next_ms == int(T0 * 1000)
    advance(node, 10)
    got = drain(node)
    assert [m["x-scheduled-at"] for m in got] == [S.iso(int(T0 * 1000) + n * 1000)
                                                  for n in range(11)]
    assert all(m["x-schedule"] == "tick" and m["k"] == "v" for m in got)
    (view,) = node.service.scheduler.list("q")
    assert (view.fired, view.last_ms, view.next_ms) == (11, int(T0 * 1000) + 10_000,
                                                        int(T0 * 1000) + 11_000)


def test_a_fire_proposed_twice_stores_once(node: LocalNode) -> None:
    node.service.scheduler.put("q", "tick", {"content": "hi"}, every=1)
    after = int(T0 * 1000)
    op = C.schedule_fire("q", "tick", after, [after], 0, after + 1000)
    assert node.service.submit(op)[1] != []
    assert node.service.submit(op) == (0, None)            # moved on: nothing
    stale = C.schedule_fire("q", "tick", after, [after, after + 1000], 0, after + 2000)
    assert node.service.submit(stale) == (0, None)
    assert len(drain(node)) == 1


def test_posting_the_same_definition_again_keeps_its_state(node: LocalNode) -> None:
    sched = node.service.scheduler
    sched.put("q", "tick", {"content": "hi"}, every=5)
    advance(node, 12)
    node.clock.t += 0.4
    status, view = sched.put("q", "tick", {"content": "hi"}, every=5)
    assert status == "unchanged" and view.fired == 3 and view.defn.anchor_ms == T0 * 1000
    status, view = sched.put("q", "tick", {"content": "changed"}, every=5)
    assert status == "replaced" and view.fired == 3 and view.defn.anchor_ms > T0 * 1000


def test_pause_and_resume_a_schedule_and_its_queue(node: LocalNode) -> None:
    sched = node.service.scheduler
    sched.put("q", "tick", {"content": "x"}, every=1, catch_up="all", grace=5)
    advance(node, 2)
    assert sched.set_paused("q", "tick", True) is True
    assert sched.set_paused("q", "tick", True) is False
    advance(node, 3)
    assert len(drain(node)) == 3
    assert sched.set_paused("q", "tick", False) is True
    advance(node, 1)
    assert len(drain(node)) == 4          # the three it missed (all) and the one now
    node.service.set_paused("q", True)     # a paused queue's schedules wait too
    advance(node, 10)
    node.service.set_paused("q", False)
    advance(node, 1)
    assert len(drain(node)) == 11
    (view,) = sched.list("q")
    assert (view.fired, view.skipped) == (18, 0)


def test_catch_up_none_after_a_pause_skips_and_says_how_many(node: LocalNode) -> None:
    sched = node.service.scheduler
    sched.put("q", "tick", {"content": "x"}, every=1, catch_up="none", grace=2)
    advance(node, 1)
    sched.set_paused("q", "tick", True)
    advance(node, 10)
    sched.set_paused("q", "tick", False)
    advance(node, 1)
    (view,) = sched.list("q")
    assert (view.fired, view.skipped) == (2 + 3, 8)   # 3 on time (within grace) after resume


def test_state_survives_a_restart_and_goes_with_its_queue(tmp_path: Path) -> None:
    node = local_node(tmp_path / "store", FixedClock(T0))
    node.service.create_queue("q", "delayed", 0, 0, 60)
    node.service.scheduler.put("q", "daily", {"content": "x", "priority": 5},
                               cron="0 3 * * *", timezone=BERLIN, catch_up="all")
    node.service.scheduler.put("q", "tick", {"content": "y"}, every=7)
    advance(node, 21)
    before = node.service.scheduler.list("q")
    node.close()
    node = local_node(tmp_path / "store", FixedClock(T0 + 21))
    try:
        assert node.service.scheduler.list("q") == before
        node.service.delete_queue("q")
        node.service.create_queue("q", "delayed", 0, 0, 60)
        assert node.service.scheduler.list("q") == []
        with node.store.read() as txn:
            assert list(txn.items("schedules")) == []
    finally:
        node.close()


def test_errors_name_the_queue_and_the_schedule(node: LocalNode) -> None:
    sched = node.service.scheduler
    with pytest.raises(QueueNotFound):
        sched.put("nope", "tick", {"content": "x"}, every=1)
    with pytest.raises(ScheduleNotFound, match="'q' has no schedule 'nope'"):
        sched.delete("q", "nope")
    with pytest.raises(ScheduleNotFound):
        sched.set_paused("q", "nope", True)
    with pytest.raises(ScheduleNotFound):
        sched.list("q", "nope")
    with pytest.raises(InvalidArgument, match="cron: expected five fields"):
        sched.put("q", "tick", {"content": "x"}, cron="* *")
    assert sched.list("q") == []


def test_a_full_queue_refuses_an_occurrence_and_the_schedule_moves_on(tmp_path: Path) -> None:
    node = local_node(tmp_path / "store", FixedClock(T0))
    try:
        node.service.create_queue("q", "delayed", 0, 0, 60, {"max_messages": 2})
        node.service.scheduler.put("q", "tick", {"content": "x"}, every=1)
        advance(node, 4)
        (view,) = node.service.scheduler.list("q")
        assert (view.fired, view.refused) == (2, 3)
        assert "queue_full" in view.last_error
        assert view.next_ms == int(T0 * 1000) + 5000
    finally:
        node.close()


def test_a_queue_has_at_most_max_schedules(node: LocalNode, monkeypatch: Any) -> None:
    monkeypatch.setattr("doq_lib.fsm.schedules.MAX_SCHEDULES", 3)
    for n in range(3):
        node.service.scheduler.put("q", f"s{n}", {"content": "x"}, every=60)
    with pytest.raises(InvalidArgument, match="3 schedules, the most allowed"):
        node.service.scheduler.put("q", "s3", {"content": "x"}, every=60)
    node.service.scheduler.put("q", "s0", {"content": "y"}, every=60)   # replacing is fine


def test_stored_records_are_checked_like_definitions() -> None:
    defn = S.define("s", {"content": "x", "metadata": {"a": "b"}}, 0, cron="0 * * * *",
                    timezone=BERLIN)
    good = {"def": defn.to_json(), "paused": False, "next_ms": 1, "last_ms": 0, "fired": 0,
            "skipped": 0, "refused": 0, "last_error": "", "created_ms": 5}
    assert S.record_problem("s", json.loads(json.dumps(good))) is None
    bad_defs = [{"cron": "R * * * *"}, {"timezone": "Nowhere/Land"}, {"name": "t"},
                {"message": {"content": 5}}, {"message": {"content": "x", "priority": -1}},
                {"message": {"content": "x", "metadata": {"x-dead-from": "q"}}},
                {"message": {"content": "x", "extra": 1}}, {"catch_up": "x"},
                {"start_ms": -5}, {"grace": 0}, {"cron": "", "every": 0}]
    for change in bad_defs:
        forged = {**good, "def": {**good["def"], **change}}
        assert S.record_problem("s", forged) is not None, change
    for change in [{"next_ms": -1}, {"fired": "3"}, {"paused": 1}, {"last_error": None},
                   {"created_ms": S.MAX_TIME * 1000 + 1}]:
        assert S.record_problem("s", {**good, **change}) is not None, change
    assert S.record_problem("s", {"def": {}}) is not None


def test_backups_carry_schedules_and_restores_check_them(tmp_path: Path) -> None:
    from tests.core.test_backup import queue_state, restore, take
    from tests.core.test_fsm import Node, create

    source, target = Node(tmp_path / "source"), Node(tmp_path / "target")
    try:
        source.ok(create("q", "fair", 1, 0, 60))
        nightly = S.define("nightly", {"content": "n", "metadata": {"k": "v"}, "ttl": 60},
                           0, cron="30 2 * * *", timezone=BERLIN, catch_up="all",
                           end_at=S.MAX_TIME)
        tick = S.define("tick", {"content": "t", "group": "g.h", "priority": 7}, 5000,
                        every=S.MAX_EVERY, start_at=S.MAX_TIME - 1, grace=S.MAX_GRACE)
        source.ok(C.schedule_put("q", nightly.to_json(), 9_000, False))
        source.ok(C.schedule_put("q", tick.to_json(), (S.MAX_TIME - 1) * 1000, True))
        assert len(source.ok(C.schedule_fire("q", "nightly", 9_000, [9_000, 9_500], 3,
                                             10_000))) == 2
        full = take(source)
        assert restore(target, full)[0] == 0
        assert queue_state(target) == queue_state(source)
        assert target.sm.schedule_views("q") == source.sm.schedule_views("q")
        version = source.sm.applied_index
        source.ok(C.schedule_delete("q", "tick"))
        source.ok(C.schedule_pause("q", "nightly", True))
        assert restore(target, full, take(source, version + 1), token="u")[0] == 0
        assert queue_state(target) == queue_state(source)
        target.restart()
        (view,) = target.sm.schedule_views("q") or []
        assert (view.defn, view.paused, view.fired, view.skipped, view.next_ms) == (
            nightly, True, 2, 3, 10_000)
    finally:
        source.close()
        target.close()


def test_a_schedule_that_cannot_be_planned_does_not_stop_the_others(
        node: LocalNode, monkeypatch: Any, caplog: Any) -> None:
    sched = node.service.scheduler
    sched.put("q", "good", {"content": "g"}, every=1)
    sched.put("q", "bad", {"content": "b"}, every=1)
    real = S.plan

    def plan(defn: S.Definition, next_ms: int, now_ms: int) -> S.Plan | None:
        if defn.name == "bad":
            raise RuntimeError("a bug in planning")
        return real(defn, next_ms, now_ms)
    monkeypatch.setattr("doq_lib.scheduler.schedules.plan", plan)
    for _ in range(3):
        node.clock.t += 1
        assert sched.round() > 0                     # it waits: no spinning on the bad one
    views = {v.defn.name: v for v in sched.list("q")}
    assert (views["good"].fired, views["bad"].fired) == (4, 0)
    assert sum("could not be planned" in r.getMessage() for r in caplog.records) == 1


def test_a_round_fires_a_bounded_number_the_earliest_first_and_yields(
        node: LocalNode, monkeypatch: Any) -> None:
    """1,200 schedules due at once, across two queues: one round plans and proposes at most
    ROUND_FIRES of them, the earliest first, says more is due (0 s), and gives the event
    loop a turn between its slices; the next rounds take the rest, each once."""
    import gevent

    from doq_lib import scheduler as scheduler_module

    sched = node.service.scheduler
    node.service.create_queue("r", "delayed", 0, 0, 60)
    for n in range(1200):
        sched.put("q" if n % 2 else "r", f"s{n:04d}", {"content": str(n)}, every=60,
                  start_at=int(T0) + 1 + n)
    node.clock.t += 3000                          # all of them due, each a few times missed
    yields = []
    real_sleep = gevent.sleep

    def counted(seconds: float = 0) -> None:
        yields.append(seconds)
        real_sleep(seconds)
    monkeypatch.setattr(scheduler_module.gevent, "sleep", counted)
    monkeypatch.setattr(scheduler_module, "SCAN_CHUNK", 100)
    assert sched.round() == 0.0                   # more due than one round fires
    fired = sorted(v.defn.name for q in ("q", "r") for v in sched.list(q) if v.fired)
    assert fired == [f"s{n:04d}" for n in range(scheduler_module.ROUND_FIRES)]  # earliest
    assert len([s for s in yields if s == 0]) >= 1200 // 100     # a turn per chunk at least
    rounds = 1
    while sched.round() == 0.0:
        rounds += 1
        assert rounds < 10
    views = [v for q in ("q", "r") for v in sched.list(q)]
    assert all(v.fired >= 1 and v.next_ms > node.clock.t * 1000 for v in views)
    assert rounds + 1 == -(-1200 // scheduler_module.ROUND_FIRES)      # (the last one waits)
