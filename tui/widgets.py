"""The console's dialogs and status bar (modal forms, confirmation, help)."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import (
    Button,
    Input,
    Label,
    Select,
    Static,
)


class FormScreen(ModalScreen[dict[str, str] | None]):
    """A small form; returns the field values, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, fields: list[tuple[str, str, str]],
                 choices: dict[str, list[str]] | None = None, error: str = "") -> None:
        super().__init__()
        self.title_text, self.fields, self.choices, self.error = title, fields, choices or {}, error

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            # above the fields, so a refusal is seen even in a form taller than the screen
            yield Static(self.error, id="form-error", classes="error")
            for name, label, value in self.fields:
                yield Label(label)
                if name in self.choices:
                    yield Select([(c, c) for c in self.choices[name]], value=value,
                                 allow_blank=False, id=f"f-{name}")
                else:
                    yield Input(value=value, id=f"f-{name}")
            with Horizontal(classes="buttons"):
                yield Button("OK", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        """The first field has the focus: what is typed goes into the form, never to the
        screen's keys behind it."""
        fields = self.query("Input, Select")
        if fields:
            fields.first().focus()

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


#: Every key, by screen: the help shows them in three columns that fit one screen.
HELP_COLUMNS: list[list[tuple[str, list[tuple[str, str]]]]] = [
    [("Everywhere", [("q", "quit"), ("?", "these keys"), ("c", "cluster screen"),
                     ("esc", "back")]),
     ("Queues", [("enter", "open the queue under the cursor"),
                 ("n", "new queue (retries, dead letters, limits)"),
                 ("d", "delete the queue (asks first)"),
                 ("/", "filter by name (enter applies, empty clears)"),
                 ("s", "sort by the next column"), ("r", "refresh now")]),
     ("Groups", [("p", "pause / resume the group"), ("r", "refresh now")]),
     ("Cluster", [("r", "refresh now")])],
    [("Queue", [("e", "enqueue a message"),
                ("p", "peek: the next message, nothing taken"),
                ("T", "take the next message (unacked)"), ("D", "take it with ack"),
                ("g", "get a message by id"), ("a", "ack the shown message"),
                ("k", "nack it (why, when again)"), ("t", "touch it (longer lease)"),
                ("u", "change its priority"), ("x", "delete it (asks first)"),
                ("j", "reject it (dead-letter it now)"), ("w", "why (not) delivered"),
                ("l", "retries, dead letters, limits"),
                ("R", "redrive dead letters back"), ("P", "pause / resume delivery"),
                ("U", "purge (asks first)"), ("G", "groups of a fair queue"),
                ("C", "consumers"), ("S", "schedules"), ("b", "browse (nothing taken)")])],
    [("Schedules", [("n", "new schedule (cron or every N s)"),
                    ("p", "pause / resume the schedule"),
                    ("x", "delete it (asks first)"), ("r", "refresh now")]),
     ("Browse", [("n", "next page"), ("s", "which: all, ready, unacked"),
                 ("w", "why (not) delivered"), ("r", "back to the first page")])],
]


def help_table(sections: list[tuple[str, list[tuple[str, str]]]]) -> Table:
    """One column of the help: each screen's title, then a line per key."""
    table = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("what", ratio=1)
    for i, (title, keys) in enumerate(sections):
        if i:
            table.add_row("", "")
        table.add_row(f"[b u]{title}[/]", "")
        for key, what in keys:
            table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label("DOQ console: every key (esc closes)", classes="dialog-title")
            with Horizontal(id="help-columns"):
                for column in HELP_COLUMNS:
                    yield Static(help_table(column), classes="help-column")

    def action_close(self) -> None:
        self.dismiss(None)


class StatusBar(Static):
    """Connected node, leader, last error."""

    def on_mount(self) -> None:
        self.update(self.app.status_text())  # type: ignore[attr-defined]

