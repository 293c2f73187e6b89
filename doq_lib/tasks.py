"""Tasks: Python functions run by ``doq worker`` from DOQ queues.

    from doq_lib.tasks import App

    app = App("http://localhost:8000")

    @app.task(queue="emails", retries=5, backoff=(1, 300))
    def send_email(user_id: int) -> None:
        ...

    send_email.send(user_id=1)              # or .send_in(60, ...), .send_at(when, ...)

Then ``doq worker myapp.tasks:app --queues emails``. A message carries one call in a
versioned JSON envelope (``{"doq_task": 1, "task", "args", "kwargs"}``), readable by
programs in other languages; its metadata names the task (``doq-task``). A queue that does
not exist yet is created on first use (a fair queue, with ``<queue>.dead`` as its
dead-letter queue), when the key may.

Inside a running task, :func:`current` gives its message, and ``current().then(task, ...)``
adds a follow-up that is stored with the task's ack in one operation: a chain of tasks hands
each result on exactly once.
"""
from __future__ import annotations

import contextvars
import datetime as dt
import importlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, ParamSpec, Sequence, TypeVar

from doq_lib import tracing
from doq_lib.client import AsyncClient, Client, Delivered, connect
from doq_lib.errors import InvalidArgument, QueueNotFound

ENVELOPE = 1                       # the envelope's version (the "doq_task" key)
TASK_KEY = "doq-task"              # metadata: the task's name
DEAD_SUFFIX = ".dead"              # a task queue's dead-letter queue: <queue>.dead
MAX_DELAY = 30 * 86_400            # the longest delay an enqueue takes (seconds)

P = ParamSpec("P")
R = TypeVar("R")


class Reject(Exception):
    """Raise it in a task to dead-letter its message now (no retry)."""


def envelope(task: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """The JSON a message of a call of ``task`` carries."""
    return json.dumps({"doq_task": ENVELOPE, "task": task, "args": list(args),
                       "kwargs": kwargs}, separators=(",", ":"))


@dataclass(frozen=True)
class Call:
    """A call read from a message's envelope."""

    task: str
    args: list[Any]
    kwargs: dict[str, Any]


def read_envelope(content: str) -> Call:
    """The call in ``content`` (InvalidArgument: not an envelope this version reads)."""
    try:
        data = json.loads(content)
    except ValueError as exc:
        raise InvalidArgument(f"not a task envelope: {exc}") from None
    except RecursionError:
        raise InvalidArgument("not a task envelope: nested too deeply to read") from None
    version = data.get("doq_task") if isinstance(data, dict) else None
    if type(version) is not int or version != ENVELOPE or \
            not isinstance(data.get("task"), str) or \
            not isinstance(data.get("args", []), list) or \
            not isinstance(data.get("kwargs", {}), dict):
        raise InvalidArgument("not a task envelope of version 1")
    return Call(data["task"], data.get("args", []), data.get("kwargs", {}))


MAX_ERROR_BYTES = 4000     # of the error text a settle carries (the server takes 4096)


def error_text(text: str) -> str:
    """``text`` as a settle may carry it: valid UTF-8 (a lone surrogate replaced) of at
    most MAX_ERROR_BYTES, cut at a character."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= MAX_ERROR_BYTES and len(raw) == len(text.encode("utf-8", "ignore")):
        return text
    return raw[:MAX_ERROR_BYTES].decode("utf-8", "ignore")


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, even one whose ``str`` fails."""
    try:
        text = str(exc)
    except Exception:                          # noqa: BLE001 - a task's exception may be broken
        text = "(its message could not be read)"
    return f"{type(exc).__name__}: {text}"


def backoff_delay(attempt: int, backoff: tuple[float, float]) -> int:
    """Seconds before retry number ``attempt`` (1: the first): initial x 2^(attempt-1), at
    most the maximum (and the server's 30 days)."""
    initial, most = backoff
    return int(min(most, initial * 2 ** min(max(attempt - 1, 0), 40), MAX_DELAY))


class Task(Generic[P, R]):
    """A function run by workers; calling it runs it here, :meth:`send` queues a call."""

    def __init__(self, app: App, fn: Callable[P, R], name: str, queue: str, retries: int,
                 backoff: tuple[float, float], timeout: float | None, priority: int,
                 group: str | Callable[..., str], dont_retry: tuple[type[BaseException], ...]
                 ) -> None:
        if retries < 0:
            raise InvalidArgument("retries must be 0 or more")
        if backoff[0] < 0 or backoff[1] < backoff[0]:
            raise InvalidArgument("backoff is (initial, most) seconds, most >= initial >= 0")
        self.app, self.fn, self.name, self.queue = app, fn, name, queue
        self.retries, self.backoff, self.timeout = retries, backoff, timeout
        self.priority, self.group, self.dont_retry = priority, group, dont_retry

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<task {self.name} on {self.queue}>"

    def message(self, args: Sequence[Any], kwargs: dict[str, Any], delay: int = 0,
                dedup_key: str = "") -> dict[str, Any]:
        """The enqueue of one call (keyword arguments of ``client.enqueue`` and
        ``queue``): what :meth:`send` stores, and what ``current().then`` hands on."""
        group = self.group(*args, **kwargs) if callable(self.group) else self.group
        out: dict[str, Any] = {"queue": self.queue, "content": envelope(self.name, args, kwargs),
                               "priority": self.priority, "group": group,
                               "metadata": {TASK_KEY: self.name}}
        if delay:
            out["delay"] = delay
        if dedup_key:
            out["dedup_key"] = dedup_key
        return out

    def send(self, *args: Any, **kwargs: Any) -> int:
        """Queue a call; the message's id."""
        return self.send_with(args, kwargs)

    def send_in(self, seconds: float, *args: Any, **kwargs: Any) -> int:
        """Queue a call that runs ``seconds`` from now at the earliest (at most 30 days)."""
        return self.send_with(args, kwargs, delay=seconds)

    def send_at(self, when: dt.datetime, *args: Any, **kwargs: Any) -> int:
        """Queue a call that runs at ``when`` (an aware datetime) at the earliest."""
        if when.tzinfo is None:
            raise InvalidArgument("send_at needs an aware datetime (with a tzinfo)")
        return self.send_with(args, kwargs, delay=when.timestamp() - time.time())

    def send_with(self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
                  delay: float = 0, dedup_key: str = "") -> int:
        """Queue a call with options: ``delay`` seconds, ``dedup_key`` (in a queue with a
        dedup window, a key seen within it stores nothing)."""
        if delay > MAX_DELAY:
            raise InvalidArgument(f"a delay is at most {MAX_DELAY} seconds (30 days)")
        item = self.message(args, kwargs or {}, max(0, -(-int(delay * 1000) // 1000)),
                            dedup_key)
        with tracing.publishing(item["queue"], self.name, item["metadata"]):
            return self.app.enqueue(item)


class App:
    """The tasks of a program and the cluster they run on (``urls``: as ``connect`` takes;
    the other keyword arguments go to ``connect`` too)."""

    def __init__(self, urls: str | Sequence[str], **connect_options: Any) -> None:
        self.urls, self.connect_options = urls, connect_options
        self.tasks: dict[str, Task[Any, Any]] = {}
        self._client: Client | None = None
        self._lock = threading.Lock()
        self._queues: set[str] = set()

    def task(self, fn: Callable[P, R] | None = None, *, name: str = "", queue: str = "default",
             retries: int = 3, backoff: tuple[float, float] = (1, 300),
             timeout: float | None = None, priority: int = 0,
             group: str | Callable[..., str] = "",
             dont_retry: tuple[type[BaseException], ...] = ()) -> Any:
        """Register ``fn`` as a task (a decorator, with or without options). ``retries``:
        runs after the first that fail before its message is dead-lettered; ``backoff``:
        (initial, most) seconds between them, doubling; ``timeout``: seconds a run may take
        (see the worker); ``group``: a fair queue's group, or a function of the call's
        arguments that names it; ``dont_retry``: exceptions that dead-letter at once."""
        def register(f: Callable[P, R]) -> Task[P, R]:
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            if task_name in self.tasks:
                raise InvalidArgument(f"a task named {task_name!r} is registered already")
            made = Task(self, f, task_name, queue, retries, backoff, timeout, priority, group,
                        (Reject, *dont_retry))
            self.tasks[task_name] = made
            return made
        return register(fn) if fn is not None else register

    @property
    def client(self) -> Client:
        """The client the app sends with (connected on first use)."""
        with self._lock:
            if self._client is None:
                self._client = connect(self.urls, **self.connect_options)
            return self._client

    def connect(self) -> Client:
        """A new client of the app's cluster (a worker's thread uses its own)."""
        return connect(self.urls, **self.connect_options)

    async def connect_async(self) -> AsyncClient:
        """A new asyncio client of the app's cluster (the asyncio pool's consumers)."""
        from doq_lib.client.aio import connect_async
        return await connect_async(self.urls, **self.connect_options)

    def enqueue(self, item: dict[str, Any]) -> int:
        """Store one message (``queue`` and ``client.enqueue``'s keyword arguments),
        creating its queue on first use."""
        queue = item["queue"]
        fields = {k: v for k, v in item.items() if k != "queue"}
        try:
            return self.client.enqueue(queue, **fields).id
        except QueueNotFound:
            self.ensure_queue(queue)
            return self.client.enqueue(queue, **fields).id

    def ensure_queue(self, queue: str) -> None:
        """Create ``queue`` (fair, dead-lettering to ``<queue>.dead``) if it is missing."""
        if queue in self._queues:
            return
        names = {q.name for q in self.client.queues()}
        if queue + DEAD_SUFFIX not in names:
            self.client.create_queue(queue + DEAD_SUFFIX, "fair")
        if queue not in names:
            self.client.create_queue(queue, "fair", dead_letter_queue=queue + DEAD_SUFFIX)
        self._queues.add(queue)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


@dataclass
class Running:
    """A task run by a worker: its message and the follow-ups its ack will store."""

    message: Delivered
    task: Task[Any, Any]
    follow_ups: list[dict[str, Any]] = field(default_factory=list)

    def then(self, task: Task[Any, Any], *args: Any, **kwargs: Any) -> None:
        """Send a call of ``task`` when this one succeeds, in the same operation as its
        ack (not at all if it fails)."""
        item = task.message(args, kwargs)
        tracing.inject(item["metadata"])             # the run's trace goes on to it
        self.follow_ups.append(item)


_current: contextvars.ContextVar[Running | None] = contextvars.ContextVar("doq_task",
                                                                          default=None)


def current() -> Running:
    """The task running here (its thread, or its asyncio task); InvalidArgument outside a
    worker's task."""
    running = _current.get()
    if running is None:
        raise InvalidArgument("no task is running here")
    return running


def set_current(running: Running | None) -> None:
    """The worker marks the task that runs here (None: done)."""
    _current.set(running)


def load_app(spec: str) -> App:
    """The App named by ``module:attribute`` (InvalidArgument: not found)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidArgument(f"{spec!r}: expected module:attribute, e.g. myapp.tasks:app")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import {module_name}: {exc}") from None
    if not hasattr(module, attribute):
        raise InvalidArgument(f"{spec}: {module_name} has no {attribute!r}")
    app = getattr(module, attribute)
    if not isinstance(app, App):
        raise InvalidArgument(f"{spec}: {module_name}.{attribute} is a "
                              f"{type(app).__name__}, not a doq_lib.tasks.App")
    return app
