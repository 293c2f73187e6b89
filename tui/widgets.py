"""The console's dialogs and status bar (modal forms, confirmation, help)."""
from __future__ import annotations

from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import (
    Button,
    Input,
    Label,
    Markdown,
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
| | `n` | new queue (form, with retries, dead letters and limits) |
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
| | `j` | reject the shown message (dead-letter it now) |
| | `w` | why is the shown message (not) delivered |
| | `l` | retries, dead letters and limits (form) |
| | `R` | redrive: a dead-letter queue's messages back where they came from |
| | `P` | pause / resume delivery of the queue |
| | `U` | purge (choose whether unacked ones go too, then confirm) |
| | `G` | the groups of a fair queue |
| | `C` | the consumers the queue knows |
| | `S` | the queue's schedules |
| | `b` | browse the messages (nothing taken) |
| groups | `p` | pause / resume the group under the cursor |
| | `r` | refresh now |
| schedules | `n` | new schedule (cron in a time zone, or every N seconds) |
| | `p` | pause / resume the schedule under the cursor |
| | `x` | delete the schedule under the cursor (asks first) |
| | `r` | refresh now |
| browse | `n` | next page |
| | `s` | which messages: all, ready, unacked |
| | `w` | why is the message under the cursor (not) delivered |
| | `r` | back to the first page |
| cluster | `r` | refresh now |
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)


class StatusBar(Static):
    """Connected node, leader, last error."""

    def on_mount(self) -> None:
        self.update(self.app.status_text())  # type: ignore[attr-defined]

