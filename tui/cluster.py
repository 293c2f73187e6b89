"""The console's cluster screen: every node's role, health, term, indexes and lag, and the
leader changes it sees."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, Static

from tui.backend import NodeStatus
from tui.widgets import StatusBar

if TYPE_CHECKING:
    from tui.app import DoqConsole


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
            health = ("[green]up[/]" if n.seen == "direct" else "[green]up[/] (leader's view)") \
                if n.healthy else "[red]down[/]"
            table.add_row(s.id, role, health,
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
            f"Cluster — {len(nodes)} node{'' if len(nodes) == 1 else 's'}, "
            f"leader {leader or 'none'}")

