"""`doq tui`: a keyboard-first terminal console for DOQ (Textual).

Talks to any node through doq_lib.client (HTTP), retrying through the other given URLs;
every network call runs in a worker thread so the screen never freezes. Never imports gevent.
"""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import (
    Button,
    DataTable,
    Footer,
    Input,
    Label,
    Markdown,
    Select,
    Sparkline,
    Static,
)

from doq_lib.client import NO_SECURITY, HttpClient, RetryPolicy, Security
from doq_lib.errors import DoqError
from doq_lib.models import Message, QueueInfo, ServerInfo

SAMPLES = 120                       # points kept per sparkline
SORTS = ("name", "ready", "unacked", "total", "enqueue_rps")
ERROR_SHOWN_FOR = 10.0              # seconds the status bar keeps the last error at least


# -- talking to the cluster ------------------------------------------------------------------

@dataclass
class NodeStatus:
    server: ServerInfo
    state: str = "?"
    term: int | None = None
    commit: int | None = None
    applied: int | None = None
    healthy: bool = False


class Backend:
    """What the screens need, over the HTTP client (blocking: call from worker threads)."""

    def __init__(self, urls: Sequence[str], timeout: float = 3.0,
                 security: Security = NO_SECURITY) -> None:
        self.client = HttpClient(urls, timeout=timeout,
                                 retry=RetryPolicy(attempts=len(urls) + 1, deadline=timeout),
                                 discover=False, security=security)
        self.timeout = timeout
        self._headers = security.headers()

    @property
    def node(self) -> str:
        return self.client.node

    def close(self) -> None:
        self.client.close()

    def queues(self) -> list[QueueInfo]:
        return self.client.queues()

    def cluster(self) -> list[NodeStatus]:
        out = []
        for server in self.client.servers():
            status = NodeStatus(server)
            if server.http_addr:
                self._fill(status, server.http_addr)
            out.append(status)
        return out

    def _fill(self, status: NodeStatus, addr: str) -> None:
        """Role, term and indexes from the node's /internal/status (admin keys only); with
        a key that may not read it, only whether the node is alive (/livez)."""
        try:
            code, body = self._get(addr, "/internal/status")
            if code in (401, 403):
                code, _ = self._get(addr, "/livez")
                status.healthy = code == 200
                return
            if code != 200:
                raise ValueError(f"status {code}")
            raft = json.loads(body)["raft"]
            status.state, status.term = raft["state"], raft["term"]
            status.commit, status.applied = raft["commit_index"], raft["fsm_applied"]
            status.healthy = True
        except (OSError, ValueError, KeyError, http.client.HTTPException):
            status.healthy = False

    def _get(self, addr: str, path: str) -> tuple[int, bytes]:
        conn = self.client.connection(addr, min(self.timeout, 1.5))
        try:
            conn.request("GET", path, headers=self._headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()


# -- modal dialogs ---------------------------------------------------------------------------

class FormScreen(ModalScreen[dict[str, str] | None]):
    """A small form; returns the field values, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, fields: list[tuple[str, str, str]],
                 choices: dict[str, list[str]] | None = None, error: str = "") -> None:
        super().__init__()
        self.title_text, self.fields, self.choices, self.error = title, fields, choices or {}, error

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            for name, label, value in self.fields:
                yield Label(label)
                if name in self.choices:
                    yield Select([(c, c) for c in self.choices[name]], value=value,
                                 allow_blank=False, id=f"f-{name}")
                else:
                    yield Input(value=value, id=f"f-{name}")
            yield Static(self.error, id="form-error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("OK", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def _values(self) -> dict[str, str]:
        out = {}
        for name, _, _ in self.fields:
            widget: Any = self.query_one(f"#f-{name}")
            out[name] = str(widget.value)
        return out

    @on(Input.Submitted)
    def submitted(self) -> None:
        self.dismiss(self._values())

    @on(Button.Pressed, "#ok")
    def ok(self) -> None:
        self.dismiss(self._values())

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "yes", "Yes"), Binding("n,escape", "no", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, classes="dialog-title")
            yield Label("y: yes    n / Esc: no")

    def action_yes(self) -> None:
        self.dismiss(True)

    def action_no(self) -> None:
        self.dismiss(False)


HELP = """\
# DOQ console — keys

| where | key | what |
|---|---|---|
| everywhere | `q` | quit |
| | `?` | this help |
| | `c` | cluster screen |
| | `escape` | back |
| queues | `enter` | open the queue under the cursor |
| | `n` | new queue (form) |
| | `d` | delete the queue under the cursor (asks first) |
| | `/` | filter by name (`enter` applies, empty clears) |
| | `s` | sort by the next column (name, ready, unacked, total, enqueue rate) |
| | `r` | refresh now |
| queue | `e` | enqueue a message (form) |
| | `p` | peek: dequeue without ack (the message stays unacked) |
| | `D` | dequeue with ack |
| | `g` | get a message by id |
| | `a` / `k` / `t` | ack / nack / touch the shown message |
| | `u` | update the shown message's priority |
| | `x` | delete the shown message (asks first) |
| cluster | `r` | refresh now |
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)


# -- screens ---------------------------------------------------------------------------------

class StatusBar(Static):
    """Connected node, leader, last error."""

    def on_mount(self) -> None:
        self.update(self.app.status_text())  # type: ignore[attr-defined]


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
        for q in rows:
            table.add_row(q.name, q.type.value, q.ready, q.unacked, q.total,
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
        v = values or {"name": "", "type": "delayed", "strategy": "round_robin",
                       "max_unacked": "0", "ack_timeout": "1800"}
        form = FormScreen("New queue", [
            ("name", "Name", v["name"]), ("type", "Type", v["type"]),
            ("strategy", "Strategy (fair queues)", v["strategy"]),
            ("max_unacked", "Max unacked per group (fair queues)", v["max_unacked"]),
            ("ack_timeout", "Ack timeout, seconds (at least 60)", v["ack_timeout"])],
            choices={"type": ["delayed", "fair"], "strategy": ["round_robin", "weighted"]},
            error=error)

        def done(values: dict[str, str] | None) -> None:
            if values is None:
                return
            try:
                fair = values["type"] == "fair"
                max_unacked = int(values["max_unacked"] or 0) if fair else 0
                ack_timeout = int(values["ack_timeout"] or 0)
            except ValueError:
                self.action_create("max unacked and ack timeout are whole numbers", values)
                return

            def call(b: Backend) -> None:
                b.client.create_queue(values["name"].strip(), values["type"],
                                      values["strategy"] if fair else None, max_unacked,
                                      ack_timeout)

            self.doq.run_call("create queue", call,
                              lambda _: self._done(f"queue {values['name']} created"),
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
        Binding("escape", "app.pop_screen", "Back"), Binding("e", "enqueue", "Enqueue"),
        Binding("p", "dequeue(False)", "Peek"), Binding("D", "dequeue(True)", "Dequeue+ack"),
        Binding("g", "get", "Get id"), Binding("a", "ack", "Ack"), Binding("k", "nack", "Nack"),
        Binding("t", "touch", "Touch"), Binding("u", "priority", "Priority"),
        Binding("x", "delete", "Delete msg"),
    ]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.queue = name
        self.message: Message | None = None
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
        yield Static("No message shown: p to peek, D to dequeue with ack, g to get by id.",
                     id="message")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(self.doq.refresh_every, self.refresh_info)
        self.refresh_info()

    def refresh_info(self) -> None:
        self.doq.run_call("queue", lambda b: b.client.queue(self.queue), self._show)

    def _show(self, info: QueueInfo) -> None:
        s = info.settings
        strategy = f"  strategy {s.strategy.name.lower()}" if info.type.value == "fair" else ""
        self.query_one("#settings", Static).update(
            f"type {info.type.value}{strategy}  max unacked {s.max_unacked}  "
            f"ack timeout {s.ack_timeout}s\nready {info.ready}   unacked {info.unacked}   "
            f"total {info.total}")
        for key, values in self.samples.items():
            values.append(float(getattr(info, key)))
            del values[:-SAMPLES]
            value = getattr(info, key)
            self.query_one(f"#l-{key}", Label).update(
                f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}")
            self.query_one(f"#s-{key}", Sparkline).data = list(values)

    def _show_message(self, msg: Message, how: str) -> None:
        self.message = msg
        self.query_one("#message", Static).update(
            f"[b]message {msg.id}[/b] ({how})\ngroup {msg.group or 'default'}   priority "
            f"{msg.priority}\ncontent: {msg.content}\nmetadata: {msg.metadata or {}}\n"
            "a ack · k nack · t touch · u priority · x delete")
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

    def action_dequeue(self, ack: bool) -> None:
        self.doq.run_call("dequeue", lambda b: b.client.dequeue(self.queue, ack=ack),
                          lambda m: self._show_message(
                              m, "dequeued and acked" if ack else "dequeued, unacked"))

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

    def _act(self, what: str, call: Callable[[Backend, Message], Any]) -> None:
        msg = self.message
        if msg is None:
            self.app.notify("no message shown: peek, dequeue or get one first",
                            severity="warning")
            return
        self.doq.run_call(what, lambda b: call(b, msg),
                          lambda _: self._done(f"{what}: {msg.id}"))

    def _done(self, text: str) -> None:
        self.app.notify(text)
        self.refresh_info()

    def action_ack(self) -> None:
        self._act("ack", lambda b, m: b.client.ack(self.queue, m.id))

    def action_nack(self) -> None:
        self._act("nack", lambda b, m: b.client.nack(self.queue, m.id))

    def action_touch(self) -> None:
        self._act("touch", lambda b, m: b.client.touch(self.queue, m.id))

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


class ClusterScreen(Screen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("r", "refresh", "Refresh")]

    def __init__(self) -> None:
        super().__init__()
        self.leader: str | None = None
        self.leader_addr: str | None = None
        self._refreshing = False

    @property
    def doq(self) -> "DoqConsole":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Label("Cluster", classes="title", id="cluster-title")
        table: DataTable[Any] = DataTable(id="nodes", cursor_type="row")
        table.add_columns("node", "role", "health", "term", "commit", "applied", "lag",
                          "raft address", "http")
        yield table
        yield Static("", id="events")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(self.doq.refresh_every, self.action_refresh)
        self.action_refresh()

    def action_refresh(self) -> None:
        # One refresh at a time: overlapping ones could finish out of order, and an older
        # view (the killed leader still leading) would overwrite a newer one.
        if self._refreshing:
            return
        self._refreshing = True
        self.doq.run_call("cluster", lambda b: b.cluster(), self._show, self._refresh_failed)

    def _refresh_failed(self, message: str) -> None:
        self._refreshing = False

    def _show(self, nodes: list[NodeStatus]) -> None:
        self._refreshing = False
        table = self.query_one("#nodes", DataTable)
        table.clear()
        found = next((n.server for n in nodes if n.server.is_leader), None)
        leader = found.id if found is not None else None
        for n in nodes:
            s = n.server
            role = "[b green]leader[/]" if s.is_leader else n.state if n.healthy else "–"
            table.add_row(s.id, role, "[green]up[/]" if n.healthy else "[red]down[/]",
                          n.term if n.term is not None else "–",
                          n.commit if n.commit is not None else "–",
                          n.applied if n.applied is not None else "–",
                          s.lag if s.lag is not None else "–", s.addr, s.http_addr or "–",
                          key=s.id)
        # A change is announced once another node leads (compared by Raft address: a member's
        # id shows up shortly after it starts). While an election runs, nodes may still name
        # the old leader or none at all; those views are not a change yet.
        if found is not None and found.addr != self.leader_addr:
            if self.leader_addr is not None:
                text = f"leader changed: {self.leader} → {leader}"
                self.query_one("#events", Static).update(
                    f"[b yellow]{time.strftime('%H:%M:%S')} {text}[/]")
                self.app.notify(text, severity="warning")
            self.leader_addr = found.addr
        if found is not None:
            self.leader = leader
        self.query_one("#cluster-title", Label).update(
            f"Cluster — {len(nodes)} nodes, leader {leader or 'none'}")


# -- the app ---------------------------------------------------------------------------------

class DoqConsole(App[None]):
    TITLE = "DOQ console"
    CSS = """
    .title { text-style: bold; padding: 0 1; color: $accent; }
    #status { dock: bottom; offset-y: -1; height: 1; background: $panel; padding: 0 1; }
    #filter { margin: 0 1; }
    #dialog { width: 64; height: auto; padding: 1 2; border: thick $accent; background: $surface; }
    #help { width: 90%; height: 90%; border: thick $accent; background: $surface; }
    ModalScreen { align: center middle; }
    .dialog-title { text-style: bold; margin-bottom: 1; }
    .buttons { height: auto; margin-top: 1; }
    .error { color: $error; }
    #settings { padding: 0 1; height: auto; }
    #sparks { grid-size: 3; grid-gutter: 0 2; height: 9; padding: 0 1; }
    .spark { height: 3; }
    Sparkline { height: 1; }
    #message { border: round $accent; padding: 0 1; margin: 1; height: auto; }
    #events { padding: 0 1; height: 2; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"), Binding("question_mark", "help", "Help"),
        Binding("c", "cluster", "Cluster"),
    ]

    def __init__(self, urls: Sequence[str], refresh_every: float = 2.0,
                 timeout: float = 3.0, security: Security = NO_SECURITY) -> None:
        super().__init__()
        self.urls = list(urls)
        self.refresh_every = refresh_every
        self.backend = Backend(self.urls, timeout, security)
        self.last_error = ""
        self.last_error_at = 0.0
        self.leader = ""

    def on_mount(self) -> None:
        self.push_screen(QueuesScreen())
        self.set_interval(max(self.refresh_every, 1.0), self._find_leader)
        self._find_leader()

    def on_unmount(self) -> None:
        self.backend.close()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_cluster(self) -> None:
        if not isinstance(self.screen, ClusterScreen):
            self.push_screen(ClusterScreen())

    def _find_leader(self) -> None:
        def call(b: Backend) -> str:
            leader = next((s for s in b.client.servers() if s.is_leader), None)
            return f"{leader.id} ({leader.http_addr})" if leader else "none"
        self.run_call("leader", call, self._leader_found)

    def _leader_found(self, leader: str) -> None:
        self.leader = leader
        if time.monotonic() - self.last_error_at > ERROR_SHOWN_FOR:
            self.last_error = ""              # the cluster answers again: an old error goes
        self._status()

    def status_text(self) -> str:
        text = f"node {self.backend.node} · leader {self.leader or '?'}"
        if self.last_error:
            text += f" · [red]{self.last_error}[/]"
        return text

    def _status(self) -> None:
        for bar in self.screen.query(StatusBar):
            bar.update(self.status_text())

    def run_call(self, what: str, call: Callable[[Backend], Any], done: Callable[[Any], Any],
                 on_error: Callable[[str], Any] | None = None) -> None:
        """Run ``call`` in a worker thread; ``done`` (or the error) back on the UI thread."""
        self._call(what, call, done, on_error)

    @work(thread=True, group="calls")
    def _call(self, what: str, call: Callable[[Backend], Any], done: Callable[[Any], Any],
              on_error: Callable[[str], Any] | None) -> None:
        try:
            result = call(self.backend)
        except DoqError as exc:
            self.call_from_thread(self._failed, what, exc.message, on_error)
            return
        except OSError as exc:
            self.call_from_thread(self._failed, what, str(exc), on_error)
            return
        self.call_from_thread(done, result)

    def _failed(self, what: str, message: str, on_error: Callable[[str], Any] | None) -> None:
        self.last_error = f"{what}: {message}"
        self.last_error_at = time.monotonic()
        self._status()
        if on_error is not None:
            on_error(message)
        elif what not in ("queues", "queue", "cluster", "leader"):
            self.notify(f"{what} failed: {message}", severity="error", timeout=6)


def run(urls: Sequence[str], refresh_every: float = 2.0,
        security: Security = NO_SECURITY) -> int:
    DoqConsole(urls, refresh_every, security=security).run()
    return 0
