"""The console's screens: the queues, one queue (the cluster's: tui/cluster.py)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import Screen
from textual.widgets import (
    DataTable,
    Footer,
    Input,
    Label,
    Sparkline,
    Static,
)

from doq_lib.models import (
    LIFECYCLE_SETTINGS,
    OVERFLOW_POLICIES,
    Message,
    QueueInfo,
    QueueSettings,
)
from tui.backend import Backend
from tui.controls import (
    BrowseScreen,
    ConsumersScreen,
    GroupsScreen,
    SchedulesScreen,
    explain_text,
)
from tui.widgets import ConfirmScreen, FormScreen, StatusBar

if TYPE_CHECKING:
    from tui.app import DoqConsole

SAMPLES = 120                       # points kept per sparkline
SORTS = ("name", "ready", "unacked", "total", "enqueue_rps")
LIFECYCLE_LABELS = {
    "max_deliveries": "Max deliveries before dead-lettering (0 = unlimited)",
    "dead_letter_queue": "Dead-letter queue (empty = drop and count)",
    "max_messages": "Max messages held (0 = unlimited)",
    "overflow": "When full",
    "dedup_window": "Dedup window, seconds (0 = off)",
    "backoff_initial": "Back-off after a failed delivery, first, seconds",
    "backoff_max": "Back-off, longest, seconds",
    "message_ttl": "Message TTL, seconds (0 = none)",
    "max_in_flight": "Max unacked in the whole queue (0 = unlimited)",
    "group_rate": "Deliveries per second of each group (0 = unlimited)",
    "group_burst": "Deliveries a group may take at once (at least 1)",
}
LIFECYCLE_CHOICES = {"overflow": list(OVERFLOW_POLICIES)}
LIFECYCLE_NUMBERS_ERROR = "the numbers are whole numbers of seconds or messages"


def lifecycle_values(settings: QueueSettings | None) -> dict[str, str]:
    """The lifecycle settings as form values (the defaults when there are no settings)."""
    s = settings if settings is not None else QueueSettings()
    return {key: str(getattr(s, key)) for key in LIFECYCLE_SETTINGS}


def lifecycle_fields(values: dict[str, str]) -> list[tuple[str, str, str]]:
    return [(key, LIFECYCLE_LABELS[key], values[key]) for key in LIFECYCLE_SETTINGS]


def parse_lifecycle(given: dict[str, str]) -> dict[str, Any]:
    """The lifecycle settings of a submitted form; ValueError for a number that is not one
    (the server judges the ranges and names the field)."""
    out: dict[str, Any] = {}
    for key, kind in LIFECYCLE_SETTINGS.items():
        text = given[key].strip()
        out[key] = text if kind is str else kind(text or QueueSettings.__dataclass_fields__[
            key].default)
    return out


class QueuesScreen(Screen[None]):
    BINDINGS = [
        Binding("enter", "open", "Open"), Binding("n", "create", "New"),
        Binding("d", "delete", "Delete"), Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"), Binding("r", "refresh", "Refresh"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.queues: list[QueueInfo] = []
        self.filter = ""
        self.sort = 0

    @property
    def doq(self) -> "DoqConsole":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Label("Queues", classes="title", id="queues-title")
        yield Input(placeholder="filter by name (enter)", id="filter")
        table: DataTable[Any] = DataTable(id="queues", cursor_type="row", zebra_stripes=True)
        table.add_columns("name", "type", "ready", "unacked", "total", "enq/s", "deq/s",
                          "ack/s", "nack/s")
        yield table
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#filter", Input).display = False
        self.set_interval(self.doq.refresh_every, self.action_refresh)
        self.action_refresh()
        self.query_one("#queues", DataTable).focus()

    def action_refresh(self) -> None:
        self.doq.run_call("queues", lambda b: b.queues(), self._show)

    def _show(self, queues: list[QueueInfo]) -> None:
        self.queues = queues
        self._draw()

    def _draw(self) -> None:
        table = self.query_one("#queues", DataTable)
        key = SORTS[self.sort]
        rows = [q for q in self.queues if self.filter.lower() in q.name.lower()]
        rows.sort(key=lambda q: getattr(q, key), reverse=key != "name")
        current = self.selected()
        table.clear()
        dlqs = {q.settings.dead_letter_queue for q in self.queues}
        for q in rows:
            kind = f"{q.type.value} · DLQ" if q.name in dlqs else q.type.value
            table.add_row(q.name, kind, q.ready, q.unacked, q.total,
                          f"{q.enqueue_rps:.1f}", f"{q.dequeue_rps:.1f}", f"{q.ack_rps:.1f}",
                          f"{q.nack_rps:.1f}", key=q.name)
        if current is not None and current in {q.name for q in rows}:
            table.move_cursor(row=table.get_row_index(current))
        title = f"Queues ({len(rows)} of {len(self.queues)}) — sorted by {key}"
        if self.filter:
            title += f", filter “{self.filter}”"
        self.query_one("#queues-title", Label).update(title)

    def selected(self) -> str | None:
        table = self.query_one("#queues", DataTable)
        if not table.row_count:
            return None
        try:
            return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
        except Exception:  # noqa: BLE001 - no row under the cursor
            return None

    def action_open(self) -> None:
        name = self.selected()
        if name is not None:
            self.app.push_screen(QueueScreen(name))

    @on(DataTable.RowSelected, "#queues")
    def row_selected(self) -> None:
        self.action_open()

    def action_sort(self) -> None:
        self.sort = (self.sort + 1) % len(SORTS)
        self._draw()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#filter")
    def apply_filter(self, event: Input.Submitted) -> None:
        self.filter = event.value.strip()
        event.input.display = bool(self.filter)
        self.query_one("#queues", DataTable).focus()
        self._draw()

    def action_create(self, error: str = "", values: dict[str, str] | None = None) -> None:
        """The new-queue form: the base settings, then retries, dead letters and limits (only
        the ones changed from their defaults are sent)."""
        v = values or {"name": "", "type": "delayed", "strategy": "round_robin",
                       "max_unacked": "0", "ack_timeout": "1800",
                       **lifecycle_values(None)}
        form = FormScreen("New queue", [
            ("name", "Name", v["name"]), ("type", "Type", v["type"]),
            ("strategy", "Strategy (fair queues)", v["strategy"]),
            ("max_unacked", "Max unacked per group (fair queues)", v["max_unacked"]),
            ("ack_timeout", "Ack timeout, seconds (at least 60)", v["ack_timeout"]),
            *lifecycle_fields(v)],
            choices={"type": ["delayed", "fair"], "strategy": ["round_robin", "weighted"],
                     **LIFECYCLE_CHOICES},
            error=error)

        def done(values: dict[str, str] | None) -> None:
            if values is None:
                return
            try:
                fair = values["type"] == "fair"
                max_unacked = int(values["max_unacked"] or 0) if fair else 0
                ack_timeout = int(values["ack_timeout"] or 0)
                lifecycle = QueueSettings(**parse_lifecycle(values)).lifecycle()
            except ValueError:
                self.action_create(LIFECYCLE_NUMBERS_ERROR, values)
                return

            def call(b: Backend) -> Any:
                return b.client.create_queue(values["name"].strip(), values["type"],
                                             values["strategy"] if fair else None,
                                             max_unacked, ack_timeout, **lifecycle)

            def made(out: Any) -> None:
                name = values["name"].strip()
                self._done(f"queue {name} exists already: nothing changed" if out.existed
                           else f"queue {name} created")
            self.doq.run_call("create queue", call, made,
                              on_error=lambda msg: self.action_create(msg, values))
        self.app.push_screen(form, done)

    def _done(self, text: str) -> None:
        self.app.notify(text)
        self.action_refresh()

    def action_delete(self) -> None:
        name = self.selected()
        if name is None:
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.doq.run_call("delete queue", lambda b: b.client.delete_queue(name),
                                  lambda _: self._done(f"queue {name} deleted"))
        self.app.push_screen(ConfirmScreen(f"Delete queue {name} and all its messages?"), done)


class QueueScreen(Screen[None]):
    BINDINGS = [
        # the footer shows the everyday keys; `?` lists them all (widgets.HELP_COLUMNS)
        Binding("escape", "app.pop_screen", "Back"), Binding("e", "enqueue", "Enqueue"),
        Binding("p", "peek", "Peek"), Binding("T", "dequeue(False)", "Take"),
        Binding("D", "dequeue(True)", "Take+ack"), Binding("a", "ack", "Ack"),
        Binding("k", "nack", "Nack"), Binding("b", "browse", "Browse"),
        Binding("g", "get", "Get id", show=False), Binding("t", "touch", "Touch", show=False),
        Binding("u", "priority", "Priority", show=False),
        Binding("x", "delete", "Delete msg", show=False),
        Binding("j", "reject", "Reject", show=False),
        Binding("R", "redrive", "Redrive", show=False),
        Binding("l", "lifecycle", "Retries/limits", show=False),
        Binding("P", "pause", "Pause/resume", show=False),
        Binding("U", "purge", "Purge", show=False), Binding("G", "groups", "Groups", show=False),
        Binding("C", "consumers", "Consumers", show=False),
        Binding("S", "schedules", "Schedules", show=False),
        Binding("w", "why", "Why", show=False),
    ]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.queue = name
        self.message: Message | None = None
        self.taken = False              # the shown message was dequeued unacked (settleable)
        self.info: QueueInfo | None = None
        self.samples: dict[str, list[float]] = {k: [] for k in (
            "ready", "unacked", "enqueue_rps", "dequeue_rps", "ack_rps", "nack_rps")}

    @property
    def doq(self) -> "DoqConsole":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Label(f"Queue {self.queue}", classes="title", id="queue-title")
        yield Static("", id="settings")
        with Grid(id="sparks"):
            for key in self.samples:
                with Vertical(classes="spark"):
                    yield Label(key, id=f"l-{key}")
                    yield Sparkline([], id=f"s-{key}")
        yield Static("No message shown: p to peek at the next one (nothing taken), T to take it "
                     "(unacked), D to take it with ack, g to get one by id.", id="message")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        for spark in self.query(Sparkline):
            spark.visible = False               # empty until there are samples to draw
        self.set_interval(self.doq.refresh_every, self.refresh_info)
        self.refresh_info()

    def refresh_info(self) -> None:
        self.doq.run_call("queue", lambda b: b.client.queue(self.queue), self._show)

    def _show(self, info: QueueInfo) -> None:
        self.info = info
        s = info.settings
        strategy = f"  strategy {s.strategy.name.lower()}" if info.type.value == "fair" else ""
        lifecycle = "  ".join(f"{k.replace('_', ' ')} {v}" for k, v in s.lifecycle().items())
        paused = "   [b yellow]PAUSED[/]" if info.paused else ""
        if info.paused_groups:
            paused += f"   {info.paused_groups} group(s) paused"
        self.query_one("#settings", Static).update(
            f"type {info.type.value}{strategy}  max unacked {s.max_unacked}  "
            f"ack timeout {s.ack_timeout}s\nready {info.ready}   unacked {info.unacked}   "
            f"total {info.total}{paused}" + (f"\n{lifecycle}" if lifecycle else ""))
        for key, values in self.samples.items():
            values.append(float(getattr(info, key)))
            del values[:-SAMPLES]
            value = getattr(info, key)
            self.query_one(f"#l-{key}", Label).update(
                f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}")
            spark = self.query_one(f"#s-{key}", Sparkline)
            spark.data = list(values)
            spark.visible = len(values) >= 2    # one sample would draw a full bar

    def _show_message(self, msg: Message, how: str, taken: bool = False) -> None:
        """Show ``msg``; ``taken``: this console holds its delivery (dequeued unacked), so
        ack, nack, reject and touch apply; a peeked or looked-up one offers only what does
        not settle a delivery."""
        self.message, self.taken = msg, taken
        more = f"deliveries {msg.deliveries}"
        if msg.last_error:
            more += f"   last error: {msg.last_error}"
        if msg.expires_at:
            when = time.localtime(msg.expires_at / 1000)
            more += f"   expires {time.strftime('%Y-%m-%d %H:%M:%S', when)}"
        self.query_one("#message", Static).update(
            f"[b]message {msg.id}[/b] ({how})\ngroup {msg.group or 'default'}   priority "
            f"{msg.priority}\ncontent: {msg.content}\nmetadata: {msg.metadata or {}}\n{more}\n"
            + ("a ack · k nack · j reject · t touch · u priority · x delete · w why" if taken
               else "u priority · x delete · w why (not taken by this console: nothing to "
                    "ack; T takes the next one)"))
        self.refresh_info()

    def action_enqueue(self, error: str = "", values: dict[str, str] | None = None) -> None:
        v = values or {"content": "", "priority": "0", "group": "", "id": ""}
        form = FormScreen(f"Enqueue into {self.queue}", [
            ("content", "Content", v["content"]), ("priority", "Priority", v["priority"]),
            ("group", "Group (empty: default)", v["group"]),
            ("id", "Id (empty: generated)", v["id"])], error=error)

        def done(values: dict[str, str] | None) -> None:
            if values is None:
                return
            try:
                priority = int(values["priority"] or 0)
                mid = int(values["id"]) if values["id"].strip() else 0
            except ValueError:
                self.action_enqueue("priority and id are whole numbers", values)
                return
            self.doq.run_call("enqueue", lambda b: b.client.enqueue(
                self.queue, values["content"], priority, values["group"].strip(), id=mid),
                lambda m: self._done(f"enqueued {m.id}"),
                on_error=lambda msg: self.action_enqueue(msg, values))
        self.app.push_screen(form, done)

    def action_peek(self) -> None:
        """The message a dequeue would take next, shown without taking it."""
        def shown(page: Any) -> None:
            messages, _ = page
            if not messages:
                self.query_one("#message", Static).update(
                    "nothing ready to peek at: the queue has no deliverable message")
                self.message = None
                return
            self._show_message(messages[0].message, "peeked: not taken; T takes it")
        self.doq.run_call("peek", lambda b: b.client.browse(self.queue, state="ready",
                                                            limit=1), shown)

    def action_dequeue(self, ack: bool) -> None:
        self.doq.run_call("dequeue", lambda b: b.client.dequeue(self.queue, ack=ack),
                          lambda m: self._show_message(
                              m, "taken and acked" if ack else "taken, unacked", not ack))

    def action_get(self) -> None:
        def done(values: dict[str, str] | None) -> None:
            if not values:
                return
            try:
                mid = int(values["id"])
            except ValueError:
                self.app.notify("an id is a whole number", severity="error")
                return
            self.doq.run_call("get", lambda b: b.client.get(self.queue, mid),
                              lambda m: self._show_message(m, "looked up"))
        self.app.push_screen(FormScreen("Get a message", [("id", "Id", "")]), done)

    def _act(self, what: str, call: Callable[[Backend, Message], Any],
             settles: bool = False) -> None:
        msg = self.message
        if msg is None:
            self.app.notify("no message shown: take (T, D) or get (g) one first",
                            severity="warning")
            return
        if settles and not self._holds(what):
            return

        def done(_: Any) -> None:
            if settles and what != "touch":
                self.taken = False          # settled: its delivery is over
            self._done(f"{what}: {msg.id}")
        self.doq.run_call(what, lambda b: call(b, msg), done)

    def _holds(self, what: str) -> bool:
        """Whether the shown message's delivery is this console's to ``what``; says why not."""
        if not self.taken:
            self.app.notify(f"cannot {what} message {self.message.id if self.message else ''}: "
                            "it was not taken by this console (T takes the next one)",
                            severity="warning")
        return self.taken

    def _done(self, text: str) -> None:
        self.app.notify(text)
        self.refresh_info()

    def action_ack(self) -> None:
        self._act("ack", lambda b, m: b.client.ack(self.queue, m.id, delivery=m.delivery),
                  settles=True)

    def action_nack(self, error: str = "", values: dict[str, str] | None = None) -> None:
        """Give the shown message back: why (kept as its last error) and when it may come
        again (empty: the queue's back-off); the panel then says what became of it."""
        msg = self.message
        if msg is None:
            self.app.notify("no message shown: take (T, D) or get (g) one first",
                            severity="warning")
            return
        if not self._holds("nack"):
            return
        v = values or {"error": "", "delay": "", "priority": ""}
        form = FormScreen(f"Nack message {msg.id}", [
            ("error", "Why (kept as its last error)", v["error"]),
            ("delay", "Deliver again after, seconds (empty: the queue's back-off)",
             v["delay"]),
            ("priority", "New priority (empty: its own)", v["priority"])], error=error)

        def done(values: dict[str, str] | None) -> None:
            if values is None:
                return
            try:
                delay = int(values["delay"]) if values["delay"].strip() else 0
                priority = int(values["priority"]) if values["priority"].strip() else 0
            except ValueError:
                self.action_nack("the delay and the priority are whole numbers", values)
                return

            def said(nacked: Any) -> None:
                self.message = None
                if nacked.dead_lettered:
                    what = "dead-lettered: its deliveries are used up"
                else:
                    when = f"after {delay} s" if delay else "after the queue's back-off"
                    what = f"back in the queue, delivered again {when}"
                self.query_one("#message", Static).update(
                    f"[b]message {msg.id}[/b] nacked: {what}"
                    + (f"\nerror: {values['error']}" if values["error"] else ""))
                self._done(f"nacked {msg.id}")
            self.doq.run_call("nack", lambda b: b.client.nack(
                self.queue, msg.id, priority=priority, error=values["error"], delay=delay,
                delivery=msg.delivery), said,
                on_error=lambda text: self.action_nack(text, values))
        self.app.push_screen(form, done)

    def action_reject(self) -> None:
        self._act("reject", lambda b, m: b.client.reject(self.queue, m.id, "rejected in doq tui",
                                                         delivery=m.delivery), settles=True)

    def action_redrive(self) -> None:
        """Move this queue's dead letters back, each to the queue it came from."""
        self.doq.run_call("redrive", lambda b: b.client.redrive(self.queue),
                          lambda out: self._done(
                              f"redrive: {out.count} moved, {len(out.failed)} not moved"))

    def action_lifecycle(self, error: str = "", values: dict[str, str] | None = None) -> None:
        """Edit the retry, dead-letter and limit settings (a field left as it is keeps its
        value; a dead-letter queue the key may not see is left out of the form and kept)."""
        hidden = self.info is not None and self.info.dead_letter_queue_hidden
        if values is None:
            values = lifecycle_values(self.info.settings if self.info is not None else None)
        fields = [f for f in lifecycle_fields(values)
                  if not (hidden and f[0] == "dead_letter_queue")]
        form = FormScreen(f"Retries, dead letters, limits of {self.queue}", fields,
                          choices=LIFECYCLE_CHOICES, error=error)

        def done(given: dict[str, str] | None) -> None:
            if given is None:
                return
            try:
                changes = parse_lifecycle({**values, **given})
            except ValueError:
                self.action_lifecycle(LIFECYCLE_NUMBERS_ERROR, given)
                return
            if hidden:
                changes.pop("dead_letter_queue", None)
            self.doq.run_call("settings", lambda b: b.client.update_queue(
                self.queue, **changes), lambda _: self._done("settings saved"),
                on_error=lambda msg: self.action_lifecycle(msg, given))
        self.app.push_screen(form, done)

    # -- operator controls ---------------------------------------------------------
    def action_pause(self) -> None:
        resume = self.info is not None and self.info.paused
        self.doq.run_call("resume" if resume else "pause", lambda b: (
            b.client.resume if resume else b.client.pause)(self.queue),
            lambda _: self._done("queue resumed" if resume else "queue paused: nothing is "
                                 "delivered until it is resumed (P)"))

    def action_purge(self) -> None:
        form = FormScreen(f"Purge {self.queue}", [
            ("include_unacked", "Drop the unacked messages too", "no")],
            choices={"include_unacked": ["no", "yes"]})

        def chosen(values: dict[str, str] | None) -> None:
            if values is None:
                return
            everything = values["include_unacked"] == "yes"

            def confirmed(yes: bool | None) -> None:
                if yes:
                    self.doq.run_call("purge", lambda b: b.client.purge(
                        self.queue, everything), lambda n: self._done(f"purged {n} messages"))
            what = "every message, unacked ones too" if everything else "every waiting message"
            self.app.push_screen(ConfirmScreen(f"Purge {what} of {self.queue}?"), confirmed)
        self.app.push_screen(form, chosen)

    def action_groups(self) -> None:
        if self.info is not None and self.info.type.value != "fair":
            self.app.notify("only fair queues have groups", severity="warning")
            return
        self.app.push_screen(GroupsScreen(self.queue))

    def action_browse(self) -> None:
        self.app.push_screen(BrowseScreen(self.queue))

    def action_consumers(self) -> None:
        self.app.push_screen(ConsumersScreen(self.queue))

    def action_schedules(self) -> None:
        self.app.push_screen(SchedulesScreen(self.queue))

    def action_why(self) -> None:
        msg = self.message
        if msg is None:
            self._act("why", lambda b, m: None)
            return
        self.doq.run_call("explain", lambda b: b.client.explain(self.queue, msg.id),
                          lambda out: self.app.notify(f"message {msg.id}: {explain_text(out)}",
                                                      timeout=8))

    def action_touch(self) -> None:
        self._act("touch", lambda b, m: b.client.touch(self.queue, m.id, delivery=m.delivery),
                  settles=True)

    def action_priority(self) -> None:
        if self.message is None:
            self._act("priority", lambda b, m: None)
            return

        def done(values: dict[str, str] | None) -> None:
            if not values:
                return
            try:
                priority = int(values["priority"])
            except ValueError:
                self.app.notify("a priority is a whole number", severity="error")
                return
            self._act("priority", lambda b, m: b.client.update_priority(
                self.queue, m.id, priority))
        self.app.push_screen(FormScreen("New priority", [
            ("priority", "Priority", str(self.message.priority))]), done)

    def action_delete(self) -> None:
        if self.message is None:
            self._act("delete", lambda b, m: None)
            return

        def done(yes: bool | None) -> None:
            if yes:
                self._act("delete", lambda b, m: b.client.delete(self.queue, m.id))
        self.app.push_screen(ConfirmScreen(f"Delete message {self.message.id}?"), done)
