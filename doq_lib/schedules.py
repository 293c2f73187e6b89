"""Schedules (L0): what a schedule is, when it fires, and what the leader proposes.

A schedule belongs to a queue and stores a copy of its ``message`` there at each occurrence:
``cron`` (five fields, or an ``@hourly``-style alias, read by croniter in ``timezone``) or
``every`` N seconds (from ``start_at``, else from its creation, to the second), between
``start_at`` and ``end_at`` when given.

Only the leader reads the clock and evaluates cron. The state machine never does: each
operation carries the times the leader computed (the next occurrence, the occurrences it
fires), so every replica applies the same thing whatever its time zone database or croniter
version. Firing is a compare-and-set on the schedule's next occurrence (``after``): a second
proposal of the same occurrence — the same leader twice, or a new leader that had not yet
applied the old one's — finds the schedule moved on and changes nothing. An occurrence
therefore fires once, across failovers and restarts.

Lateness. An occurrence fired within ``grace`` seconds of its time is on time, however many
there are (a failover of a few seconds loses nothing). Occurrences later than that were
missed (the cluster was down, the schedule or its queue was paused) and ``catch_up`` says what
happens to them: ``all`` fires each of them (at most :data:`MAX_FIRED` per operation, in
order), ``one`` fires the latest of them once, ``none`` fires none.

Time zones and daylight saving time. Cron fields are wall-clock times in ``timezone``
(default UTC). When the clocks go forward, a wall time inside the gap (02:30 on a day that
jumps from 02:00 to 03:00) fires as the same time past the gap would (03:30), once; when they
go back, a wall time that happens twice (02:30 on a day that repeats 02:00-03:00) fires once,
at its first instance. ``every`` counts real seconds and ignores time zones.
"""
from __future__ import annotations

import bisect
import calendar
import copy
import datetime as dt
import functools
import importlib.resources
import re
import zoneinfo
from typing import Any, Iterator, NamedTuple

from croniter import CroniterBadDateError, CroniterError, croniter

from doq_lib import rules

CATCH_UP = ("none", "one", "all")
DEFAULT_CATCH_UP = "one"
DEFAULT_GRACE = 60                 # seconds late an occurrence is still on time
MAX_GRACE = 86_400
MAX_EVERY = 366 * 86_400          # seconds between two occurrences of an ``every`` schedule
MAX_CRON = 200                     # characters of a cron expression
MAX_NAME = 200                     # characters of a schedule name
MAX_SCHEDULES = 1000               # schedules of one queue
MAX_TIME = 253_402_300_799         # 9999-12-31T23:59:59Z: the last start_at / end_at
MAX_FIRED = 1000                   # occurrences one operation fires at most
ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_ZONE = re.compile(r"[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*")
_RANDOM = re.compile(r"(^|,)[RrHh](\(|/|$|,)")
_BACK = dt.timedelta(hours=3)      # more than any daylight-saving shift
_UTC = dt.timezone.utc
#: Metadata the server sets on each message a schedule stores (users may not).
SCHEDULE_KEY, OCCURRENCE_KEY = "x-schedule", "x-scheduled-at"


class ScheduleError(ValueError):
    """A definition that cannot be accepted: ``field`` names the part, the text says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class Definition(NamedTuple):
    """A schedule as its owner wrote it (times in unix ms; ``anchor_ms``: where ``every``
    counts from)."""

    name: str
    cron: str                      # "" for an ``every`` schedule
    every: int                     # seconds; 0 for a cron schedule
    timezone: str
    message: dict[str, Any]        # content, priority, group, metadata, ttl
    start_ms: int                  # 0: from now
    end_ms: int                    # 0: no end
    catch_up: str
    grace: int                     # seconds
    anchor_ms: int

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Definition:
        return cls(**{field: raw[field] for field in cls._fields})

    def same_as(self, other: Definition) -> bool:
        """Whether ``other`` says the same thing (an ``every`` schedule with no start counts
        from its first creation: posting it again keeps that)."""
        return self._replace(anchor_ms=0) == other._replace(anchor_ms=0)


def check_name(name: str) -> None:
    if not name or len(name) > MAX_NAME or not _NAME.fullmatch(name):
        raise ScheduleError("name", f"1 to {MAX_NAME} characters: letters, digits and "
                                    "_ . : - (starting with a letter or digit)")


def check_cron(expr: str) -> None:
    """Refuse what is not a standard cron expression (five fields or an alias)."""
    if len(expr) > MAX_CRON or not expr.isascii() or not expr.isprintable():
        raise ScheduleError("cron", f"at most {MAX_CRON} printable ASCII characters")
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise ScheduleError("cron", f"unknown alias {text!r}: expected one of "
                                        f"{', '.join(ALIASES)}")
        return
    fields = text.split()
    if len(fields) != 5:
        raise ScheduleError("cron", "expected five fields (minute hour day-of-month month "
                                    f"day-of-week), got {len(fields)}; for seconds use every")
    if any(_RANDOM.search(f) for f in fields):
        raise ScheduleError("cron", "random (R) and hashed (H) fields are not supported: "
                                    "each node would pick different times")
    try:
        croniter(text, dt.datetime(2000, 1, 1)).get_next(dt.datetime)
    except CroniterBadDateError:
        raise ScheduleError("cron", "it never matches a date (for example 30 February)") \
            from None
    except (CroniterError, ValueError, KeyError, IndexError, OverflowError) as exc:
        raise ScheduleError("cron", f"not a cron expression: {exc}") from None


@functools.lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    """The IANA time zone names, from the tzdata package (the same list on every node,
    whatever the host's own database holds), without ``Factory`` (a placeholder, not a
    place)."""
    listed = importlib.resources.files("tzdata").joinpath("zones").read_text("utf-8")
    return frozenset(listed.split()) - {"Factory"}


def check_zone(name: str) -> None:
    """Refuse what is not an IANA time zone name: ``localtime`` (each host's own zone, so a
    cron would fire at another instant after a failover), ``posixrules``, ``Factory``,
    ``right/...`` and ``posix/...`` among them."""
    zone(name)
    if name not in _zone_names():
        raise ScheduleError("timezone", f"{name[:64]!r} is not an IANA time zone name (such "
                                        "as Europe/Berlin or UTC): host-specific and "
                                        "placeholder zones are refused")


def zone(name: str) -> dt.tzinfo:
    """The time zone ``name`` (an IANA key such as Europe/Berlin, or UTC). A stored
    schedule's zone is loaded by this check alone (:func:`check_zone` is the rule for a
    new one), so what was stored before can always be restored."""
    if not name or len(name) > 64 or not _ZONE.fullmatch(name):
        raise ScheduleError("timezone", "expected an IANA time zone name such as "
                                        "Europe/Berlin or UTC")
    if name == "UTC":
        return _UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError("timezone", f"unknown time zone {name!r}") from None


def define(name: str, message: dict[str, Any], now_ms: int, cron: str = "",
           every: int | None = None,
           timezone: str = "", start_at: int = 0, end_at: int = 0,
           catch_up: str = DEFAULT_CATCH_UP, grace: int = DEFAULT_GRACE) -> Definition:
    """A checked definition (ScheduleError names what is wrong). Times are unix seconds;
    ``message`` was checked as an enqueue's by the caller; ``every`` None: not given."""
    check_name(name)
    if bool(cron) == (every is not None):
        raise ScheduleError("cron", "give either cron or every (seconds), not both")
    if cron:
        check_cron(cron)
        check_zone(timezone or "UTC")
    else:
        if timezone:
            raise ScheduleError("timezone", "applies to cron schedules only (every counts "
                                            "real seconds)")
        if isinstance(every, bool) or not isinstance(every, int) or \
                not 1 <= every <= MAX_EVERY:
            raise ScheduleError("every", f"expected whole seconds from 1 to {MAX_EVERY}")
    for field, value in (("start_at", start_at), ("end_at", end_at)):
        if isinstance(value, bool) or not isinstance(value, int) or \
                not 0 <= value <= MAX_TIME:
            raise ScheduleError(field, f"expected unix seconds from 0 to {MAX_TIME}")
    if end_at and end_at < start_at:
        raise ScheduleError("end_at", "is before start_at")
    if catch_up not in CATCH_UP:
        raise ScheduleError("catch_up", f"expected one of {', '.join(CATCH_UP)}")
    if isinstance(grace, bool) or not isinstance(grace, int) or not 1 <= grace <= MAX_GRACE:
        raise ScheduleError("grace", f"expected whole seconds from 1 to {MAX_GRACE}")
    anchor = start_at * 1000 if start_at else -(-now_ms // 1000) * 1000
    period = every or 0
    return Definition(name, cron.strip(), period, (timezone or "UTC") if cron else "",
                      message, start_at * 1000, end_at * 1000, catch_up, grace,
                      anchor if period else 0)


# -- when it fires ---------------------------------------------------------------------------

def occurrences(defn: Definition, after_ms: int) -> Iterator[int]:
    """The schedule's occurrences later than ``after_ms`` (unix ms), in order."""
    after_ms = max(after_ms, defn.start_ms - 1)
    source = _every(defn, after_ms) if defn.every else _cron(defn, after_ms)
    for at in source:
        if defn.end_ms and at > defn.end_ms:
            return
        yield at


def next_after(defn: Definition, after_ms: int) -> int:
    """The first occurrence later than ``after_ms`` (0: none, the schedule has ended)."""
    return next(occurrences(defn, after_ms), 0)


def _every(defn: Definition, after_ms: int) -> Iterator[int]:
    period = defn.every * 1000
    k = 0 if after_ms < defn.anchor_ms else (after_ms - defn.anchor_ms) // period + 1
    at = defn.anchor_ms + k * period
    while at <= MAX_TIME * 1000:
        yield at
        at += period


def _cron(defn: Definition, after_ms: int) -> Iterator[int]:
    tz = zone(defn.timezone)
    try:
        wall = dt.datetime.fromtimestamp(after_ms / 1000, tz).replace(tzinfo=None)
    except (OverflowError, ValueError, OSError):
        return
    shifts = tz is not _UTC
    # Only near a change of the zone's offset can a wall time before ``after``'s fall after
    # it (one in a spring gap maps past the gap): look back then, else start at once (a
    # per-minute cron would otherwise walk three hours of minutes for every occurrence).
    back = shifts and _offset_changes(tz, after_ms)
    it = _iterator(defn.cron, wall - _BACK if back else wall)
    last = after_ms
    while True:
        try:
            naive = it.get_next(dt.datetime)
        except (CroniterError, OverflowError, ValueError):
            return                                   # none left before year 9999
        at = int(naive.replace(tzinfo=tz, fold=0).timestamp() * 1000) if shifts else \
            int(naive.replace(tzinfo=_UTC).timestamp() * 1000)
        if at > last:                 # (a wall time in a gap can map before the one after it)
            last = at
            yield at


@functools.lru_cache(maxsize=1024)
def _parsed(cron: str) -> croniter:
    return croniter(cron)


def _iterator(cron: str, start: dt.datetime) -> croniter:
    """croniter over ``cron`` from ``start``: a copy of the expression parsed once (parsing
    costs more than a step)."""
    it = copy.copy(_parsed(cron))
    it.set_current(start, force=True)
    return it


def _offset_changes(tz: dt.tzinfo, at_ms: int) -> bool:
    """Whether ``tz``'s offset from UTC changes within _BACK of ``at_ms``."""
    seconds = _BACK.total_seconds()
    offsets = set()
    for ms in (at_ms - seconds * 1000, at_ms, at_ms + seconds * 1000):
        try:
            offsets.add(dt.datetime.fromtimestamp(ms / 1000, tz).utcoffset())
        except (OverflowError, ValueError, OSError):
            return True
    return len(offsets) > 1


def last_at_or_before(defn: Definition, limit_ms: int, from_ms: int) -> int:
    """The latest occurrence in [from_ms, limit_ms] (0: none)."""
    if defn.end_ms:
        limit_ms = min(limit_ms, defn.end_ms)
    from_ms = max(from_ms, defn.start_ms)
    if limit_ms < from_ms:
        return 0
    if defn.every:
        if limit_ms < defn.anchor_ms:
            return 0
        period = defn.every * 1000
        at = defn.anchor_ms + (limit_ms - defn.anchor_ms) // period * period
    else:
        at = _cron_last(defn, limit_ms)
    return at if at >= from_ms else 0


def _cron_last(defn: Definition, limit_ms: int) -> int:
    tz = zone(defn.timezone)
    try:
        wall = dt.datetime.fromtimestamp(limit_ms / 1000, tz).replace(tzinfo=None)
    except (OverflowError, ValueError, OSError):
        return 0
    # From just past ``limit`` (a minute: cron has no seconds); only near a change of the
    # zone's offset can a later wall time map before it, so only then look from further on.
    ahead = dt.timedelta(minutes=1)
    if tz is not _UTC and _offset_changes(tz, limit_ms):
        ahead += _BACK
    it = _iterator(defn.cron, wall + ahead)
    for _ in range(400):
        try:
            naive = it.get_prev(dt.datetime)
        except (CroniterError, OverflowError, ValueError):
            return 0
        at = int(naive.replace(tzinfo=tz, fold=0).timestamp() * 1000)
        if at <= limit_ms:
            return at
    return 0


class Plan(NamedTuple):
    """What the leader proposes for a due schedule: fire ``fired`` (occurrences, unix ms)
    if its next occurrence is still ``after``, skip ``skipped`` missed ones, and move its
    next occurrence to ``next_ms`` (0: it has ended)."""

    after: int
    fired: list[int]
    skipped: int
    next_ms: int


def plan(defn: Definition, next_ms: int, now_ms: int) -> Plan | None:
    """What to do with a schedule whose next occurrence is ``next_ms`` at ``now_ms`` (None:
    nothing is due)."""
    if not next_ms or next_ms > now_ms:
        return None
    late_before = now_ms - defn.grace * 1000      # occurrences before this were missed
    fired: list[int] = []
    skipped = 0
    start = next_ms
    if next_ms < late_before and defn.catch_up != "all":
        missed_last = last_at_or_before(defn, late_before - 1, next_ms)
        if defn.catch_up == "one" and missed_last:
            fired.append(missed_last)
        skipped = max(0, _count_between(defn, next_ms, late_before - 1) - len(fired))
        start = next_after(defn, late_before - 1)
        if not start:
            return Plan(next_ms, fired, skipped, 0)
    following = 0
    for at in _from(defn, start):
        if at > now_ms or len(fired) >= MAX_FIRED:
            following = at
            break
        fired.append(at)
    return Plan(next_ms, fired, skipped, following)


def _from(defn: Definition, first: int) -> Iterator[int]:
    yield first
    yield from occurrences(defn, first)


def _count_between(defn: Definition, first: int, last: int) -> int:
    """How many occurrences lie in [first, last], ``first`` being one: counted, not walked,
    so the cost does not grow with the span. A cron schedule's are counted on its zone's
    wall clock (in a zone with daylight saving time, the occurrences of a wall hour that the
    clocks skip or repeat count as the clock shows them)."""
    if defn.end_ms:
        last = min(last, defn.end_ms)
    if last < first:
        return 0
    if defn.every:
        return (last - first) // (defn.every * 1000) + 1
    return count_cron(defn.cron, zone(defn.timezone), first, last)


# -- counting cron occurrences ---------------------------------------------------------------
# A cron expression is a set of times of day (minute x hour) on the days its day fields
# (day of month, month, day of week) match. Which days of a year match depends only on the
# year's kind: leap or not, and the weekday of 1 January (every field, L, W and # included,
# looks only inside a month). So the matching days of each kind of year are found once, by
# croniter itself stepping a once-a-day expression with the same day fields through a sample
# year of that kind, and a count over any span is arithmetic over whole years (whole 400-year
# Gregorian cycles past that) plus the two partial days at its ends.

_ALIAS_FIELDS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
                 "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
                 "@hourly": "0 * * * *"}
_DAY_MS = 86_400_000
_CYCLE = 400                                   # years of the Gregorian calendar's cycle
_SAMPLE_YEARS: dict[tuple[bool, int], int] = {}
for _year in range(2001, 2029):                # 28 years hold every kind of year
    _SAMPLE_YEARS.setdefault((calendar.isleap(_year), dt.date(_year, 1, 1).weekday()), _year)


def _fields(cron: str) -> list[str]:
    text = cron.strip()
    return _ALIAS_FIELDS.get(text.lower(), text).split()


@functools.lru_cache(maxsize=1024)
def _times_of_day(cron: str) -> tuple[int, ...]:
    """The expression's times of day, ms after midnight, in order."""
    minutes, hours = croniter(" ".join(_fields(cron))).expanded[:2]
    mins = range(60) if minutes == ["*"] else sorted(int(m) for m in minutes)
    hrs = range(24) if hours == ["*"] else sorted(int(h) for h in hours)
    return tuple((h * 60 + m) * 60_000 for h in hrs for m in mins)


@functools.lru_cache(maxsize=4096)
def _year_days(days: str, leap: bool, weekday: int) -> tuple[int, ...]:
    """Ordinals (1 = 1 January) of the days that the day fields ``days`` match in a year of
    that kind, in order (at most 366 croniter steps, once per kind and fields)."""
    year = _SAMPLE_YEARS[(leap, weekday)]
    it = croniter(f"0 0 {days}", dt.datetime(year - 1, 12, 31, 23, 59))
    out: list[int] = []
    while len(out) < 366:
        try:
            found = it.get_next(dt.datetime)
        except (CroniterError, OverflowError, ValueError):
            break
        if found.year != year:
            break
        out.append(found.timetuple().tm_yday)
    return tuple(out)


def _days_of(days: str, year: int) -> tuple[int, ...]:
    return _year_days(days, calendar.isleap(year), dt.date(year, 1, 1).weekday())


@functools.lru_cache(maxsize=1024)
def _cycle_days(days: str) -> int:
    """Matching days in any 400 consecutive years."""
    return sum(len(_days_of(days, year)) for year in range(2000, 2000 + _CYCLE))


def _matching_days(days: str, first: dt.date, last: dt.date) -> int:
    """How many days in [first, last] the day fields match."""
    if last < first:
        return 0
    a, b = first.timetuple().tm_yday, last.timetuple().tm_yday
    if first.year == last.year:
        found = _days_of(days, first.year)
        return bisect.bisect_right(found, b) - bisect.bisect_left(found, a)
    total = len(_days_of(days, first.year)) - bisect.bisect_left(_days_of(days, first.year), a)
    total += bisect.bisect_right(_days_of(days, last.year), b)
    cycles, rest = divmod(last.year - first.year - 1, _CYCLE)
    total += cycles * _cycle_days(days) if cycles else 0
    return total + sum(len(_days_of(days, year))
                       for year in range(first.year + 1, first.year + 1 + rest))


def count_cron(cron: str, tz: dt.tzinfo, first_ms: int, last_ms: int) -> int:
    """How many times the cron expression matches between two instants, both included, on
    the wall clock of ``tz``."""
    try:
        start = dt.datetime.fromtimestamp(first_ms / 1000, tz).replace(tzinfo=None)
        end = dt.datetime.fromtimestamp(last_ms / 1000, tz).replace(tzinfo=None)
    except (OverflowError, ValueError, OSError):
        return 0
    if end < start:                 # (the hour a zone repeats: the clock went back)
        return 0
    times, days = _times_of_day(cron), " ".join(_fields(cron)[2:])

    def within(day: dt.date, low: int, high: int) -> int:
        if not _matching_days(days, day, day):
            return 0
        return bisect.bisect_right(times, high) - bisect.bisect_left(times, low)

    def ms_of_day(at: dt.datetime) -> int:
        return ((at.hour * 60 + at.minute) * 60 + at.second) * 1000 + at.microsecond // 1000

    if start.date() == end.date():
        return within(start.date(), ms_of_day(start), ms_of_day(end))
    whole = _matching_days(days, start.date() + dt.timedelta(days=1),
                           end.date() - dt.timedelta(days=1))
    return within(start.date(), ms_of_day(start), _DAY_MS) + len(times) * whole + \
        within(end.date(), 0, ms_of_day(end))


def iso(ms: int) -> str:
    """Unix ms as an ISO 8601 time in UTC (for messages and logs)."""
    return dt.datetime.fromtimestamp(ms / 1000, _UTC).isoformat().replace("+00:00", "Z")


# -- stored records (backups and restores check them) ----------------------------------------
_COUNTS = ("fired", "skipped", "refused")
_MESSAGE_KEYS = {"content", "priority", "group", "metadata", "ttl"}


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def message_problem(message: Any, stored: bool = False) -> str | None:
    """What is wrong with a schedule's message (an enqueue's fields), if anything
    (``stored``: a stored record's, held to the rules it was accepted by)."""
    if not isinstance(message, dict) or not set(message) <= _MESSAGE_KEYS:
        return f"expected an object with {', '.join(sorted(_MESSAGE_KEYS))}"
    if not isinstance(message.get("content"), str):
        return "content: expected a string"
    if not _whole(message.get("priority", 0), 0, rules.MAX_PRIORITY):
        return f"priority: expected an integer from 0 to {rules.MAX_PRIORITY}"
    group = message.get("group", "")
    if not isinstance(group, str) or group and rules.group_problem(group) is not None:
        return "group: expected a group (a dot path)"
    if not _whole(message.get("ttl", 0), 0, rules.MAX_TTL):
        return f"ttl: expected whole seconds from 0 to {rules.MAX_TTL}"
    metadata = message.get("metadata") or {}
    if not isinstance(metadata, dict) or len(metadata) > rules.MAX_METADATA or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        return "metadata: expected string keys and values"
    for key, part, _ in rules.metadata_problems(metadata, stored):
        return f"metadata: {part} of key {(key or '')[:40]!r}"
    return None


def record_problem(name: str, data: Any) -> str | None:
    """What is wrong with the stored record of schedule ``name``, if anything: every field
    the state machine reads, with the ranges an accepted definition has."""
    try:
        defn = Definition.from_json(data["def"])
    except (KeyError, TypeError):
        return "expected a definition with every field"
    if defn.name != name:
        return "its definition has another name"
    try:
        check_name(defn.name)
        if defn.cron:
            check_cron(defn.cron)
            zone(defn.timezone)
        elif defn.timezone or not _whole(defn.every, 1, MAX_EVERY):
            return "expected cron or every"
    except ScheduleError as exc:
        return str(exc)
    if defn.catch_up not in CATCH_UP or not _whole(defn.grace, 1, MAX_GRACE):
        return "catch_up or grace out of range"
    times = (defn.start_ms, defn.end_ms, defn.anchor_ms, data.get("next_ms"),
             data.get("last_ms"), data.get("created_ms"))
    if not all(_whole(t, 0, MAX_TIME * 1000) for t in times):
        return "a time out of range"
    problem = message_problem(defn.message, stored=True)
    if problem:
        return f"message: {problem}"
    if not all(_whole(data.get(c), 0, rules.INT63_MAX) for c in _COUNTS):
        return "a count out of range"
    if not isinstance(data.get("paused"), bool) or not isinstance(data.get("last_error"), str) \
            or len(data["last_error"]) > rules.MAX_ERROR:
        return "paused or last_error malformed"
    return None
