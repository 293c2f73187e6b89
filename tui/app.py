"""`doq tui`: a keyboard-first terminal console for DOQ (Textual).

Talks to any node through doq_lib.client (HTTP), retrying through the other given URLs;
every network call runs in a worker thread so the screen never freezes. Never imports gevent.

The parts: backend.py (talking to the cluster), widgets.py (dialogs), screens.py, app.tcss
(the styles); this module is the application.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Sequence

from textual import work
from textual.app import App
from textual.binding import Binding

from doq_lib.client import NO_SECURITY, Security
from doq_lib.errors import DoqError
from tui.backend import Backend, NodeStatus
from tui.cluster import ClusterScreen
from tui.screens import QueueScreen, QueuesScreen
from tui.widgets import ConfirmScreen, FormScreen, HelpScreen, StatusBar

POLLS = ("queues", "queue", "cluster", "leader")   # the calls the screens repeat on their own
ERROR_SHOWN_FOR = 10.0              # seconds the status bar keeps the last error at least

__all__ = ["Backend", "ClusterScreen", "ConfirmScreen", "DoqConsole", "FormScreen", "HelpScreen",
           "NodeStatus", "QueueScreen", "QueuesScreen", "StatusBar", "run"]


class DoqConsole(App[None]):
    TITLE = "DOQ console"
    CSS_PATH = "app.tcss"
    BINDINGS = [
        Binding("q", "quit", "Quit"), Binding("question_mark", "help", "All keys"),
        Binding("c", "cluster", "Cluster", show=False),
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
        self.call_from_thread(self._succeeded, what, done, result)

    def _succeeded(self, what: str, done: Callable[[Any], Any], result: Any) -> None:
        # A success clears an error it outdates: one of the same call, or any error once an
        # operator's own action (not a refresh) went through.
        if self.last_error and (self.last_error.startswith(f"{what}:") or what not in POLLS):
            self.last_error = ""
            self._status()
        done(result)

    def _failed(self, what: str, message: str, on_error: Callable[[str], Any] | None) -> None:
        self.last_error = f"{what}: {message}"
        self.last_error_at = time.monotonic()
        self._status()
        if on_error is not None:
            on_error(message)
        elif what not in POLLS:
            self.notify(f"{what} failed: {message}", severity="error", timeout=6)



def run(urls: Sequence[str], refresh_every: float = 2.0,
        security: Security = NO_SECURITY) -> int:
    """The console on this terminal. Textual draws on standard error: with it redirected
    (``doq tui 2>log``) the screen is drawn on standard output's terminal instead, and what
    is written to standard error afterwards goes to the redirection again."""
    if os.isatty(2):
        DoqConsole(urls, refresh_every, security=security).run()
        return 0
    if not os.isatty(1):
        print("doq tui: needs a terminal (standard output or standard error)", file=sys.stderr)
        return 2
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(1, 2)
    try:
        DoqConsole(urls, refresh_every, security=security).run()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    return 0

