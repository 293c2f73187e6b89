"""The console's operator screens: a queue's groups with their pauses, its
consumers, its schedules, and a paged browse of its messages (nothing taken)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, Static

from doq_lib.client.common import Browsed, ConsumerInfo, Explanation
from doq_lib.client.schedules import ScheduleInfo
from doq_lib.models import GroupInfo
from tui.widgets import ConfirmScreen, FormScreen, StatusBar

if TYPE_CHECKING:
    from tui.app import DoqConsole

BROWSE_PAGE = 20
BROWSE_STATES = ("all", "ready", "unacked")
def _code(reason: dict[str, Any]) -> str:
    return str(reason["code"])              # a reason this console does not word yet


_REASONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "delayed_until": lambda r: f"scheduled for {_when(r['until'])}",
    "queue_paused": lambda r: "the queue is paused",
    "group_paused": lambda r: f"group {r['group']} is paused",
    "group_at_max_unacked": lambda r: f"group {r['group']} has {r['unacked']} of {r['max']} "
                                      "unacked",
    "queue_at_max_in_flight": lambda r: f"the queue has {r['in_flight']} of {r['max']} in "
                                        "flight",
    "group_rate_limited": lambda r: f"group {r['group']} is at its rate until "
                                    f"{_when(r['next_at'])}",
    "backoff_until": lambda r: f"backing off until {_when(r['until'])}",
}


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def explain_text(out: Explanation) -> str:
    """One line for an explain answer ("blocked: group t is paused (3 ahead)")."""
    if out.state == "unacked":
        holder = f" to {out.held_by}" if out.held_by else ""
        since = f" since {_when(out.held_since)}" if out.held_since else ""
        return f"delivered{holder}{since}, waiting for its ack"
    ahead = f"{out.ahead} deliverable ahead"
    if out.state == "ready":
        return f"ready, {ahead}"
    why = "; ".join(_REASONS.get(r["code"], _code)(r) for r in out.reasons)
    return f"blocked: {why} ({ahead})"


class _QueuePart(Screen[None]):
    def __init__(self, queue: str) -> None:
        super().__init__()
        self.queue = queue

    @property
    def doq(self) -> "DoqConsole":
        return self.app  # type: ignore[return-value]


class _TablePart(_QueuePart):
    """A refreshed table of one queue's parts: ``WHAT`` names it (title, table id, the call
    that is shown when it fails), ``COLUMNS`` heads it; :meth:`_fetch` reads the rows and
    :meth:`_row` turns one into (key, cells)."""

    WHAT = ""
    COLUMNS: tuple[str, ...] = ()

    def compose(self) -> ComposeResult:
        yield Label(f"{self.WHAT.capitalize()} of {self.queue}", classes="title",
                    id=f"{self.WHAT}-title")
        table: DataTable[Any] = DataTable(id=self.WHAT, cursor_type="row")
        table.add_columns(*self.COLUMNS)
        yield table
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(self.doq.refresh_every, self.action_refresh)
        self.action_refresh()

    def action_refresh(self) -> None:
        self.doq.run_call(self.WHAT, self._fetch, self._show)

    def _fetch(self, backend: Any) -> list[Any]:
        raise NotImplementedError

    def _row(self, item: Any) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def _done(self, text: str) -> None:
        self.app.notify(text)
        self.action_refresh()

    def _show(self, found: list[Any]) -> None:
        table = self.query_one(f"#{self.WHAT}", DataTable)
        row = table.cursor_row
        table.clear()
        for item in found:
            key, cells = self._row(item)
            table.add_row(*cells, key=key)
        if found:
            table.move_cursor(row=min(row, len(found) - 1))


class ConsumersScreen(_TablePart):
    """The consumers a queue knows: what each holds and did."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("r", "refresh", "Refresh")]
    WHAT = "consumers"
    COLUMNS = ("consumer", "holds", "oldest lease", "last seen", "deliveries", "acks", "nacks")

    def _fetch(self, backend: Any) -> list[ConsumerInfo]:
        return backend.client.consumers(self.queue)  # type: ignore[no-any-return]

    def _row(self, c: ConsumerInfo) -> tuple[str, list[Any]]:
        oldest = f"{c.oldest_lease_ms / 1000:.1f} s" if c.held else "-"
        return c.name, [c.name, c.held, oldest, _when(c.last_seen), c.deliveries, c.acks,
                        c.nacks]


class GroupsScreen(_TablePart):
    """The groups of a fair queue: p pauses or resumes the one under the cursor."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("r", "refresh", "Refresh"),
                Binding("p", "pause_group", "Pause/resume")]
    WHAT = "groups"
    COLUMNS = ("group", "ready", "unacked", "paused")

    def _fetch(self, backend: Any) -> list[GroupInfo]:
        return backend.client.groups(self.queue)  # type: ignore[no-any-return]

    def _row(self, g: GroupInfo) -> tuple[str, list[Any]]:
        paused = "" if g.paused_by is None else \
            "paused" if g.paused_by == g.group else f"paused by {g.paused_by}"
        return g.group, [g.group, g.ready, g.unacked, paused]

    def action_pause_group(self) -> None:
        table = self.query_one("#groups", DataTable)
        if not table.row_count:
            return
        group, _, _, paused = (str(c) for c in table.get_row_at(table.cursor_row))
        if paused.startswith("paused by"):
            self.app.notify(f"{group} is paused by its parent: resume that one",
                            severity="warning")
            return
        resume = paused == "paused"
        self.doq.run_call("resume group" if resume else "pause group", lambda b: (
            b.client.resume_group if resume else b.client.pause_group)(self.queue, group),
            lambda _: self._done(f"group {group} {'resumed' if resume else 'paused'}"))



class BrowseScreen(_QueuePart):
    """A page of messages at a time, nothing taken: n next page, s which state, w why the
    message under the cursor is (not) delivered."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("n", "next", "Next page"),
                Binding("s", "state", "State"), Binding("w", "why", "Why"),
                Binding("r", "first", "First page")]

    def __init__(self, queue: str) -> None:
        super().__init__(queue)
        self.state = "all"
        self.next: int | None = None
        self.page = 0

    def compose(self) -> ComposeResult:
        yield Label(f"Browse {self.queue}", classes="title", id="browse-title")
        table: DataTable[Any] = DataTable(id="browse", cursor_type="row")
        table.add_columns("id", "state", "group", "priority", "deliveries", "content")
        yield table
        yield Static("", id="browse-info")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.action_first()

    def _load(self, after: int | None) -> None:
        self.doq.run_call("browse", lambda b: b.client.browse(
            self.queue, self.state, after=after, limit=BROWSE_PAGE),
            lambda out: self._show(out, after is not None))

    def action_first(self) -> None:
        self.page = 0
        self._load(None)

    def action_next(self) -> None:
        if self.next is None:
            self.app.notify("no more messages", severity="warning")
            return
        self._load(self.next)

    def action_state(self) -> None:
        self.state = BROWSE_STATES[(BROWSE_STATES.index(self.state) + 1) % len(BROWSE_STATES)]
        self.action_first()

    def _show(self, out: tuple[list[Browsed], int | None], more: bool) -> None:
        rows, self.next = out
        self.page = self.page + 1 if more else 1
        table = self.query_one("#browse", DataTable)
        table.clear()
        for r in rows:
            m = r.message
            table.add_row(str(m.id), r.state, m.group or "default", m.priority, m.deliveries,
                          m.content[:40], key=str(m.id))
        self.query_one("#browse-info", Static).update(
            f"{self.state} · page {self.page} · {len(rows)} shown" +
            (" · n for the next page" if self.next is not None else " · the last page"))

    def action_why(self) -> None:
        table = self.query_one("#browse", DataTable)
        if not table.row_count:
            return
        mid = int(str(table.get_row_at(table.cursor_row)[0]))
        self.doq.run_call("explain", lambda b: b.client.explain(self.queue, mid),
                          lambda out: self._explained(mid, out))

    def _explained(self, mid: int, out: Explanation) -> None:
        text = f"message {mid}: {explain_text(out)}"
        self.query_one("#browse-info", Static).update(text)
        self.app.notify(text)


class SchedulesScreen(_TablePart):
    """The schedules of a queue: n adds one, p pauses or resumes the one under the cursor,
    x deletes it (after confirming)."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("r", "refresh", "Refresh"),
                Binding("n", "add", "New"), Binding("p", "pause_schedule", "Pause/resume"),
                Binding("x", "delete_schedule", "Delete")]
    WHAT = "schedules"
    COLUMNS = ("schedule", "when", "next", "last fired", "fired", "skipped", "state")

    def _fetch(self, backend: Any) -> list[ScheduleInfo]:
        return backend.client.schedules(self.queue)  # type: ignore[no-any-return]

    def _row(self, s: ScheduleInfo) -> tuple[str, list[Any]]:
        when = f"{s.cron} ({s.timezone})" if s.cron else f"every {s.every} s"
        return s.name, [s.name, when, _when(s.next_at * 1000) if s.next_at else "ended",
                        _when(s.last_fired * 1000) if s.last_fired else "-", s.fired,
                        s.skipped, "paused" if s.paused else "active"]

    def _current(self) -> tuple[str, str] | None:
        table = self.query_one("#schedules", DataTable)
        if not table.row_count:
            return None
        row = table.get_row_at(table.cursor_row)
        return str(row[0]), str(row[-1])

    def action_add(self, error: str = "", values: dict[str, str] | None = None) -> None:
        v = values or {"name": "", "cron": "", "every": "", "timezone": "", "content": ""}
        form = FormScreen(f"New schedule of {self.queue}", [
            ("name", "Name", v["name"]),
            ("cron", "Cron (minute hour day month weekday), or leave empty", v["cron"]),
            ("every", "Every N seconds (instead of cron)", v["every"]),
            ("timezone", "Time zone of the cron (empty: UTC)", v["timezone"]),
            ("content", "Message content", v["content"])], error=error)

        def done(values: dict[str, str] | None) -> None:
            if values is None:
                return
            every = values["every"].strip()
            if every and not every.isdigit():
                self.action_add("every is a whole number of seconds", values)
                return
            self.doq.run_call("add schedule", lambda b: b.client.put_schedule(
                self.queue, values["name"].strip(), values["content"],
                cron=values["cron"].strip() or None, every=int(every) if every else None,
                timezone=values["timezone"].strip() or None),
                lambda s: self._done(f"schedule {s.name} {s.status}"),
                on_error=lambda message: self.action_add(message, values))
        self.app.push_screen(form, done)

    def action_pause_schedule(self) -> None:
        current = self._current()
        if current is None:
            return
        name, state = current
        resume = state == "paused"
        self.doq.run_call("resume schedule" if resume else "pause schedule", lambda b: (
            b.client.resume_schedule if resume else b.client.pause_schedule)(self.queue, name),
            lambda _: self._done(f"schedule {name} {'resumed' if resume else 'paused'}"))

    def action_delete_schedule(self) -> None:
        current = self._current()
        if current is None:
            return
        name = current[0]

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.doq.run_call("delete schedule", lambda b: b.client.delete_schedule(
                    self.queue, name), lambda _: self._done(f"schedule {name} deleted"))
        self.app.push_screen(ConfirmScreen(f"Delete schedule {name}? The messages it stored "
                                           "stay."), confirmed)
