"""Django's Tasks framework on DOQ: a backend that queues ``@task`` calls in DOQ, and the app
``doq worker`` runs them with.

    # settings.py
    TASKS = {"default": {
        "BACKEND": "doq_lib.integrations.django.DoqBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"URLS": ["http://localhost:8000"], "RETRIES": 3},
    }}

    # then, with DJANGO_SETTINGS_MODULE set
    doq worker doq_lib.integrations.django:app --queues default,emails

The framework is ``django.tasks`` on Django 6 and the ``django-tasks`` package (the same
API) on Django 5.2; whichever is installed is used.

A call travels in DOQ's task envelope (the task named by its module path), so ``doq
worker`` runs it as any DOQ task: its queue is the task's ``queue_name`` (created on first
use, dead-lettering to ``<queue>.dead``), its ``priority`` (-100 to 100, higher first)
orders the queue, ``run_after`` holds it in DOQ until then (at most 30 days ahead). A run
that raises is retried ``RETRIES`` times (default 0: Django's tasks are not retried) with
``BACKOFF`` (initial, most) seconds between runs, then dead-lettered with its error;
``TIMEOUT`` seconds, as a DOQ task's ``timeout``. A task that takes a context gets one whose
``attempt`` is the message's delivery count. The worker closes the thread's stale database
connections before and after each run, as Django does around a request. Other ``OPTIONS``:
``API_KEY``, ``CA_FILE``, ``CERT_FILE``, ``KEY_FILE``, ``TRANSPORT`` (http, grpc).

Results are not stored (``supports_get_result`` is False): a task's outcome is its message's
(acked, or in the dead-letter queue with its error), which DOQ's API shows.
"""
from __future__ import annotations

import datetime as dt
import os
from typing import Any, Callable

from doq_lib.errors import InvalidArgument
from doq_lib.tasks import MAX_DELAY, App, Task, current

try:                                   # Django 6
    from django.tasks import TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskContext
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.signals import task_enqueued
except ImportError:                    # Django 5.2 and the django-tasks package
    from django_tasks import TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import TaskContext
    from django_tasks.exceptions import InvalidTaskError
    from django_tasks.signals import task_enqueued


def doq_priority(priority: int) -> int:
    """Django's priority (-100 to 100, higher first) as DOQ's (lower first)."""
    return 100 - int(priority)


class DoqBackend(BaseTaskBackend):
    """Queues Django tasks in DOQ for ``doq worker`` (see the module notes)."""

    supports_defer = True
    supports_async_task = True
    supports_priority = True
    supports_get_result = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = {key.upper(): value for key, value in self.options.items()}
        urls = options.get("URLS") or options.get("URL") or "http://localhost:8000"
        connect_options = {name.lower(): options[name] for name in (
            "API_KEY", "CA_FILE", "CERT_FILE", "KEY_FILE", "TRANSPORT") if options.get(name)}
        self.retries = int(options.get("RETRIES", 0))
        self.backoff = tuple(options.get("BACKOFF", (1, 300)))
        self.timeout = options.get("TIMEOUT")
        if self.retries < 0:
            raise InvalidArgument("TASKS OPTIONS: RETRIES must be 0 or more")
        self.app = App(urls, **connect_options)
        self._tasks: dict[tuple[str, str, int], Task[Any, Any]] = {}

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        if task.run_after is not None:
            ahead = task.run_after.timestamp() - dt.datetime.now(dt.timezone.utc).timestamp()
            if ahead > MAX_DELAY:
                raise InvalidTaskError("run_after is at most 30 days ahead on DOQ")

    def doq_task(self, task: Any) -> Task[Any, Any]:
        """The DOQ task that carries calls of the Django ``task`` (by its module path,
        queue and priority)."""
        key = (task.module_path, task.queue_name, task.priority)
        made = self._tasks.get(key)
        if made is None:
            made = Task(self.app, _runner(task), task.module_path, task.queue_name,
                        self.retries, (float(self.backoff[0]), float(self.backoff[1])),
                        None if self.timeout is None else float(self.timeout),
                        doq_priority(task.priority), "", ())
            self._tasks[key] = made
        return made

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        delay = 0.0
        if task.run_after is not None:
            delay = max(0.0, task.run_after.timestamp() - dt.datetime.now(
                dt.timezone.utc).timestamp())
        mid = self.doq_task(task).send_with(list(args), dict(kwargs), delay=delay)
        now = dt.datetime.now(dt.timezone.utc)
        result = TaskResult(task=task, id=str(mid), status=TaskResultStatus.READY,
                            enqueued_at=now, started_at=None, last_attempted_at=None,
                            finished_at=None, args=list(args), kwargs=dict(kwargs),
                            backend=self.alias, errors=[], worker_ids=[])
        task_enqueued.send(type(self), task_result=result)
        return result


def _runner(task: Any) -> Callable[..., Any]:
    """The function a worker runs for a call of the Django ``task``."""
    def run(*args: Any, **kwargs: Any) -> Any:
        from django.db import close_old_connections
        close_old_connections()
        try:
            if task.takes_context:
                running = current()
                now = dt.datetime.now(dt.timezone.utc)
                result = TaskResult(task=task, id=str(running.message.id),
                                    status=TaskResultStatus.RUNNING, enqueued_at=None,
                                    started_at=now, last_attempted_at=now, finished_at=None,
                                    args=list(args), kwargs=dict(kwargs),
                                    backend=task.backend, errors=[],
                                    worker_ids=["doq"] * max(1, running.message.deliveries))
                return task.call(TaskContext(task_result=result), *args, **kwargs)
            return task.call(*args, **kwargs)
        finally:
            close_old_connections()
    return run


class _Lookup(dict[str, Task[Any, Any]]):
    """Task names (module paths) to DOQ tasks, found when a worker first meets a name."""

    def __init__(self, backend: Callable[[], DoqBackend]) -> None:
        super().__init__()
        self._backend = backend

    def __missing__(self, name: str) -> Task[Any, Any]:
        from django.utils.module_loading import import_string
        try:
            found = import_string(name)
        except ImportError:
            raise KeyError(name) from None
        if not hasattr(found, "module_path") or not hasattr(found, "queue_name"):
            raise KeyError(name)                 # not a Django task
        made = self._backend().doq_task(found)
        self[name] = made
        return made

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default


class DjangoTasks(App):
    """The app ``doq worker doq_lib.integrations.django:app`` runs: Django is set up from
    ``DJANGO_SETTINGS_MODULE`` when the worker first needs it, and each task name is the
    module path of a Django task (its backend: ``DOQ_TASKS_BACKEND``, default the first
    DoqBackend in ``TASKS``)."""

    def __init__(self) -> None:
        super().__init__("http://unused.invalid:1")
        self.tasks = _Lookup(self.backend)
        self._backend: DoqBackend | None = None

    def backend(self) -> DoqBackend:
        if self._backend is None:
            import django
            from django.conf import settings
            if not settings.configured or not getattr(settings, "TASKS", None):
                django.setup()
            try:
                from django.tasks import task_backends
            except ImportError:
                from django_tasks import task_backends
            alias = os.environ.get("DOQ_TASKS_BACKEND") or next(
                (name for name, conf in settings.TASKS.items()
                 if conf.get("BACKEND", "").endswith("DoqBackend")), "default")
            backend = task_backends[alias]
            if not isinstance(backend, DoqBackend):
                raise InvalidArgument(f"TASKS[{alias!r}] is not a DoqBackend")
            self._backend = backend
        return self._backend

    @property
    def client(self) -> Any:
        return self.backend().app.client

    def connect(self) -> Any:
        return self.backend().app.connect()

    async def connect_async(self) -> Any:
        return await self.backend().app.connect_async()

    def ensure_queue(self, queue: str) -> None:
        self.backend().app.ensure_queue(queue)

    def enqueue(self, item: dict[str, Any]) -> int:
        return self.backend().app.enqueue(item)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.app.close()


#: What ``doq worker doq_lib.integrations.django:app`` runs.
app = DjangoTasks()
