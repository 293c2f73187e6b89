"""``doq worker --pool processes``: tasks run in child processes, which a task's timeout
interrupts.

The worker process keeps everything that talks to the cluster (consumers, leases, settles);
a child only runs task functions. The children are a pebble ``ProcessPool`` of
``concurrency`` processes, started with ``spawn`` (a fork of a process with gRPC and
consumer threads is not safe), each importing the app by its ``module:attribute``. A run past
its task's ``timeout`` is stopped by ending its process (SIGTERM, then SIGKILL after a few
seconds), and the pool starts a new one; the message is then given back as a failure
("interrupted"). A child that dies (a crash, an ``os._exit``) fails its run the same way.

Children run in a session of their own, so a Ctrl-C in the terminal (or a signal sent to the
worker's process group) reaches only the worker, which stops taking and lets the children
finish within ``--grace``. (Under systemd, use ``KillMode=mixed`` for the same reason.) A
child ends with its worker: one whose worker is gone (``kill -9``) exits within
``ORPHAN_CHECK`` seconds, so a task whose message runs again elsewhere once its lease ends
does not also go on here.

What crosses to a child: the task's name, its arguments (from the JSON envelope) and the
message without its client; what comes back: the follow-ups the task added
(``current().then``), or the error as text and whether it is one that is not retried.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pebble import ProcessExpired, ProcessFuture, ProcessPool

from doq_lib.client import Delivered
from doq_lib.tasks import App, Call, Reject, Running, Task, describe, load_app, set_current

_app: App | None = None           # in a child: the app it runs tasks of
ORPHAN_CHECK = 0.5                # seconds between a child's looks at whether its worker lives


class ChildFailure(Exception):
    """A task's exception as it came back from a child: its text (type: message) only."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class ChildRejected(Reject):
    """A task's exception that is not retried (Reject, or in the task's ``dont_retry``),
    as it came back from a child."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _start_child(spec: str) -> None:
    """A child's start: a session of its own (signals to the worker's group pass it by);
    the app imported."""
    global _app
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = os.getppid()
    threading.Thread(target=_end_with, args=(worker,), daemon=True,
                     name="doq-orphan-check").start()
    _app = load_app(spec)


def _end_with(worker: int) -> None:
    """(a child's thread) Exit at once when the worker process ``worker`` is gone (the
    child then has another parent)."""
    while True:
        time.sleep(ORPHAN_CHECK)
        if os.getppid() != worker:
            os._exit(70)


def run_in_child(task_name: str, args: list[Any], kwargs: dict[str, Any],
                 message: Delivered) -> tuple[str, Any]:
    """Run one task in a child: ("ok", follow-ups) or ("failed" / "rejected", text)."""
    assert _app is not None, "a child runs tasks only after _start_child"
    task = _app.tasks[task_name]
    running = Running(message, task)
    set_current(running)
    try:
        result = task.fn(*args, **kwargs)
        if inspect.isawaitable(result):
            asyncio.run(_awaited(result))
    except BaseException as exc:           # noqa: BLE001 - any failure is the task's
        # (SystemExit, KeyboardInterrupt, ... too)
        return ("rejected" if isinstance(exc, task.dont_retry) else "failed", describe(exc))
    finally:
        set_current(None)
    return "ok", running.follow_ups


async def _awaited(result: Any) -> Any:
    return await result


class Children:
    """The worker's side of the child processes."""

    def __init__(self, spec: str, concurrency: int) -> None:
        self.pool = ProcessPool(max_workers=concurrency, initializer=_start_child,
                                initargs=(spec,), context=multiprocessing.get_context("spawn"))

    def run(self, task: Task[Any, Any], call: Call, message: Delivered) -> list[Any]:
        """Run ``call`` in a child and wait: the follow-ups to store with the ack; raises
        the task's failure (ChildFailure, ChildRejected, TimeoutError: interrupted)."""
        plain = dataclasses.replace(message, settler=None)        # a client stays here
        future: ProcessFuture[tuple[str, Any]] = self.pool.schedule(
            run_in_child, (task.name, list(call.args), dict(call.kwargs), plain),
            timeout=task.timeout)
        try:
            outcome, value = future.result()
        except FutureTimeout:
            raise TimeoutError(f"timed out after {task.timeout:g} s (interrupted)") from None
        except ProcessExpired as exc:
            raise ChildFailure(f"the process running it ended (exit code {exc.exitcode})") \
                from None
        except Exception as exc:      # noqa: BLE001 - e.g. arguments that do not pickle
            raise ChildFailure(describe(exc)) from None
        if outcome == "ok":
            return list(value)
        raise (ChildRejected if outcome == "rejected" else ChildFailure)(str(value))

    def close(self) -> None:
        """End the children (those still running are stopped)."""
        self.pool.stop()  # type: ignore[no-untyped-call]
        self.pool.join(timeout=10)
