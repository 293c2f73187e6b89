"""DOQ as a Celery broker: a kombu transport for ``doq://`` URLs.

    import doq_lib.integrations.celery          # registers doq:// with kombu
    from celery import Celery

    app = Celery("proj", broker="doq://localhost:8000")
    app.conf.task_acks_late = True
    app.conf.broker_transport_options = {"visibility_timeout": 300}

``doq://host:port`` names one node's HTTP API; more nodes go in the transport option
``nodes`` (``["host:port", ...]``), and the client moves between them as
:func:`doq_lib.client.connect` does. ``doqs://`` uses HTTPS; ``doq://:KEY@host:port`` sends an
API key (or the option ``api_key``); ``ca_file``, ``cert_file``, ``key_file`` as ``connect``
takes them; ``transport``: ``http`` (default) or ``grpc``.

How Celery's notions map onto DOQ:

- A Celery queue is a DOQ delayed queue of the same name, created when Celery declares it,
  with the ``visibility_timeout`` option (seconds, default 1800) as its ack timeout.
- A message Celery publishes is stored as is (kombu's JSON envelope) in one DOQ message,
  durable on a majority of nodes when the publish returns. Its ``priority`` (0-255, higher
  first, as on RabbitMQ) orders the queue; a ``countdown``/``eta`` becomes a DOQ delay (up to
  30 days; a later eta is held by the queue's priority-as-timestamp rule), so the worker
  receives the task when it is due instead of holding it in memory.
- A worker takes up to its prefetch in one request (long-poll ``wait_time_seconds``, default
  1 s). Each delivery is acked, or given back (``reject(requeue=True)``: nack, delivered
  again at once), with its delivery token: after a lost lease the settle is refused, and
  the newer delivery goes on. Acks go out as AMQP's do, without waiting: a channel sends
  each queue's pending acks as one batch ack per round trip (``batch_acks: False`` sends
  each and waits). ``reject(requeue=False)`` dead-letters the message (dropped unless the
  queue has a dead-letter queue).
- ``acks_late`` works through DOQ's leases: while a worker holds a message (running it, or
  prefetched), the transport extends its lease every half visibility timeout (``touch``), so
  a task longer than the visibility timeout is not delivered again behind its back (the
  trap of Redis and SQS brokers); a worker killed mid-task stops extending, and its
  messages come back when their lease ends. Prefetched messages a worker gives up at
  shutdown are given back at once. ``keep_leases: False`` turns the extension off.
- Fanout and topic exchanges (Celery's broadcast remote control and events) are not
  supported: DOQ hands each message to one consumer.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import time
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, virtual

from doq_lib.client import Client, connect
from doq_lib.errors import DoqError, NotUnacked, QueueNotFound, StaleDelivery, Unavailable
from doq_lib.models import Message
from doq_lib.tasks import error_text
from doq_lib.worker_acks import AckBatcher

log = logging.getLogger("doq.celery")

MAX_DELAY = 30 * 86400           # seconds a DOQ enqueue may be delayed
MAX_TAKE = 1000                  # messages one take returns at most
TAG_KEYS = ("doq_queue", "doq_id", "doq_delivery", "doq_touched")


class DoqMessage(virtual.Message):
    """kombu's message, which remembers why its body could not be decoded. Celery then acks
    it, so that it does not come back for ever; DOQ dead-letters it instead (reason
    ``unreadable``, the decoding error in ``x-last-error``), so that it is not lost."""

    unreadable = ""

    def _decode(self) -> Any:
        try:
            return super()._decode()
        except Exception as exc:  # noqa: BLE001 - whatever kombu raises: kept, raised on
            self.unreadable = f"{type(exc).__name__}: {exc}"
            raise

    def ack(self, multiple: bool = False) -> None:
        if not self._dead_lettered():
            super().ack(multiple)

    def reject(self, requeue: bool = False) -> None:
        if requeue or not self._dead_lettered():
            super().reject(requeue)

    def _dead_lettered(self) -> bool:
        """Dead-letter it as unreadable, when its body could not be decoded."""
        if not self.unreadable or self.channel is None or self.acknowledged:
            return False
        self.channel.reject_unreadable(self.delivery_tag, self.unreadable)
        self._state = "REJECTED"
        return True


class Channel(virtual.Channel):
    """A kombu channel over a DOQ cluster (see the module notes)."""

    Message = DoqMessage
    default_visibility_timeout = 1800
    default_wait_time_seconds = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._noack_queues: set[str] = set()
        self._local = threading.local()
        self._clients: list[Client] = []
        self._clients_lock = threading.Lock()
        self._known: set[str] = set()
        self._closing = threading.Event()
        self._keeper: threading.Thread | None = None
        self._batchers: dict[str, AckBatcher] = {}
        super().__init__(*args, **kwargs)

    # -- clients: one for takes (the consuming thread), one per thread for the rest ---------
    def _connect(self) -> Client:
        conninfo = self.connection.client
        options = self.transport_options
        secure = conninfo.transport_cls == "doqs" or bool(options.get("ssl"))
        scheme = "https" if secure else "http"
        nodes = [f"{conninfo.hostname or 'localhost'}:{conninfo.port or 8000}"]
        nodes += [n for n in options.get("nodes", ()) if n not in nodes]
        client = connect([f"{scheme}://{n}" for n in nodes],
                         transport=options.get("transport", "http"),
                         timeout=float(options.get("timeout", 10.0)),
                         api_key=conninfo.password or options.get("api_key"),
                         ca_file=options.get("ca_file"), cert_file=options.get("cert_file"),
                         key_file=options.get("key_file"), consumer=options.get("consumer"))
        with self._clients_lock:
            self._clients.append(client)
        return client

    @property
    def client(self) -> Client:
        """This thread's client (acks come from the threads of Celery's pools)."""
        client: Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._connect()
        return client

    @property
    def transport_options(self) -> dict[str, Any]:
        return dict(self.connection.client.transport_options)

    @property
    def visibility_timeout(self) -> int:
        return int(float(self.transport_options.get("visibility_timeout") or
                         self.default_visibility_timeout))

    @property
    def wait_time_seconds(self) -> float:
        wait = self.transport_options.get("wait_time_seconds")
        return float(self.default_wait_time_seconds if wait is None else wait)

    def close(self) -> None:
        self._closing.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=10)
        super().close()                 # gives back what was delivered and not acked
        with self._clients_lock:
            batchers, self._batchers = list(self._batchers.values()), {}
        for batcher in batchers:
            batcher.close()             # sends the acks still pending
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    # -- queues ---------------------------------------------------------------------------
    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        if queue in self._known:
            return
        # An existing queue is left as it is (the API answers a create of one as done).
        self.client.create_queue(queue, "delayed", ack_timeout=self.visibility_timeout)
        self._known.add(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        try:
            self.client.queue(queue)
        except QueueNotFound:
            return False
        return True

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._known.discard(queue)
        try:
            self.client.delete_queue(queue)
        except QueueNotFound:
            pass

    def _purge(self, queue: str) -> int:
        return self.client.purge(queue)

    def _size(self, queue: str) -> int:
        return self.client.queue(queue).ready

    # -- publishing -----------------------------------------------------------------------
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        """Store ``message`` (kombu's envelope) in ``queue``: its priority and eta as DOQ's."""
        self._new_queue(queue)
        properties = message.get("properties") or {}
        headers = message.get("headers") or {}
        priority = 255 - min(255, max(0, int(properties.get("priority") or 0)))
        delay = 0
        eta = _eta(headers.get("eta"))
        if eta is not None:
            wait = eta - time.time()
            if wait > MAX_DELAY:
                priority = int(eta)          # a delayed queue holds a future timestamp
            elif wait > 0:
                delay = math.ceil(wait)
        metadata = {"celery-task": str(headers["task"])[:200]} if headers.get("task") else {}
        self.client.enqueue(queue, json.dumps(message), priority=priority, delay=delay,
                            metadata=metadata)

    # -- taking -----------------------------------------------------------------------------
    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._noack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        if queue is not None:
            self._noack_queues.discard(queue)
        return super().basic_cancel(consumer_tag)

    def _reset_cycle(self) -> None:
        """Take with prefetch: one request per queue per turn."""
        from kombu.utils.scheduling import FairCycle
        self._cycle = FairCycle(self._get_bulk, self._active_queues, Empty)

    def _take(self, queue: str, count: int, wait: float, no_ack: bool) -> list[dict[str, Any]]:
        try:
            messages = self.client.dequeue_many(queue, count, ack=no_ack, wait=wait)
        except QueueNotFound:
            return []
        out = []
        for message in messages:
            try:
                payload: dict[str, Any] = json.loads(message.content)
                why = _envelope_problem(payload, self.codecs)
                if why is None:
                    properties = payload["properties"]
                    if not no_ack:
                        # A tag of its own per delivery (the published one repeats).
                        properties["delivery_tag"] = message.delivery or f"{queue}:{message.id}"
                        info = properties.setdefault("delivery_info", {})
                        info.update(doq_queue=queue, doq_id=message.id,
                                    doq_delivery=message.delivery,
                                    redelivered=message.deliveries > 1,
                                    doq_touched=time.monotonic())
                    self.Message(payload, channel=self)      # kombu reads it, or says why
            except Exception as exc:  # noqa: BLE001 - whatever kombu cannot read
                why = f"{type(exc).__name__}: {exc}"
            if why is not None:
                why = error_text(f"not a kombu message: {why}")
                log.error("message %s of %s: %s: dead-lettered", message.id, queue, why)
                if not no_ack:
                    self._settle(queue, message.id, message.delivery, "reject", why)
                continue
            out.append(payload)
        if out and not no_ack:
            self._keep_leases()
        return out

    # -- leases -----------------------------------------------------------------------------
    def _keep_leases(self) -> None:
        """Start the thread that extends the leases of the messages this channel holds."""
        if self._keeper is None and self.transport_options.get("keep_leases", True):
            self._keeper = threading.Thread(target=self._extend_leases, daemon=True,
                                            name="doq-leases")
            self._keeper.start()

    def _extend_leases(self) -> None:
        """Touch each held delivery once half the visibility timeout has passed since it was
        taken or last touched; a lost lease is logged (another worker has the message)."""
        half = self.visibility_timeout / 2
        while not self._closing.wait(max(0.5, half / 2)):
            now = time.monotonic()
            try:
                held = list(self.qos._delivered.values())      # (changed by other threads)
            except RuntimeError:
                continue
            for message in held:
                info = message.delivery_info
                if info.get("doq_id") is None or message.acknowledged or \
                        now - info.get("doq_touched", now) < half:
                    continue
                try:
                    self.client.touch(info["doq_queue"], int(info["doq_id"]),
                                      delivery=info.get("doq_delivery", ""))
                    info["doq_touched"] = now
                except (StaleDelivery, NotUnacked) as exc:
                    if info.get("doq_touched") == float("inf"):
                        continue                                 # settled meanwhile
                    info["doq_touched"] = float("inf")           # lost: stop touching it
                    log.warning("message %s of %s: lease lost: %s", info["doq_id"],
                                info["doq_queue"], exc.message)
                except DoqError as exc:
                    log.warning("message %s of %s: touch failed: %s", info["doq_id"],
                                info["doq_queue"], exc.message)

    def _get_bulk(self, queue: str, callback: Any = None, timeout: float | None = None) -> None:
        most = self.qos.can_consume_max_estimate()
        count = MAX_TAKE if most is None else min(max(most, 1), MAX_TAKE)
        wait = self.wait_time_seconds if timeout is None else min(timeout,
                                                                  self.wait_time_seconds)
        payloads = self._take(queue, count, max(0.0, wait), queue in self._noack_queues)
        if not payloads:
            raise Empty()
        for payload in payloads:
            self.connection._deliver(payload, queue)

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        payloads = self._take(queue, 1, 0.0, False)
        if not payloads:
            raise Empty()
        return payloads[0]

    # -- settling ---------------------------------------------------------------------------
    def _settle(self, queue: str, mid: int, delivery: str, how: str, unreadable: str = "",
                ) -> None:
        """Ack, nack or reject one delivery (a reject with ``unreadable``: the message could
        not be read, and this says why); a settle of a delivery that is no longer current
        (its lease ran out, another worker has it) is logged and dropped."""
        client = self.client
        try:
            if how == "ack" and self.transport_options.get("batch_acks", True):
                self._batcher(queue).ack(Message(mid, "", 0, "", {}, delivery=delivery), [], "")
            elif how == "ack":
                client.ack(queue, mid, delivery=delivery)
            elif how == "nack":
                client.nack(queue, mid, delivery=delivery)
            elif unreadable:
                client.reject(queue, mid, error=unreadable, delivery=delivery,
                              reason="unreadable")
            else:
                client.reject(queue, mid, delivery=delivery)
        except (StaleDelivery, NotUnacked) as exc:
            log.warning("message %s of %s: %s not applied: %s", mid, queue, how, exc.message)

    def _batcher(self, queue: str) -> AckBatcher:
        """The queue's acks, sent in batches without waiting (as AMQP's basic.ack)."""
        with self._clients_lock:
            batcher = self._batchers.get(queue)
        if batcher is None:
            made = AckBatcher(self._connect(), queue, lambda task, applied: None)
            with self._clients_lock:
                batcher = self._batchers.setdefault(queue, made)
            if batcher is not made:
                made.close()
        return batcher

    def _settle_tag(self, delivery_tag: str, how: str) -> bool:
        try:
            info = self.qos.get(delivery_tag).delivery_info
        except KeyError:
            return False
        if info.get("doq_id") is None:
            return False
        info["doq_touched"] = float("inf")           # settled: no longer extended
        self._settle(info["doq_queue"], int(info["doq_id"]), info.get("doq_delivery", ""), how)
        return True

    def reject_unreadable(self, delivery_tag: str, why: str) -> None:
        """(DoqMessage) Dead-letter a delivery whose body could not be decoded, with why."""
        try:
            info = self.qos.get(delivery_tag).delivery_info
        except KeyError:
            return
        if info.get("doq_id") is not None:
            info["doq_touched"] = float("inf")
            why = error_text(f"the body could not be decoded: {why}")
            log.error("message %s of %s: %s: dead-lettered", info["doq_id"], info["doq_queue"],
                      why)
            self._settle(info["doq_queue"], int(info["doq_id"]), info.get("doq_delivery", ""),
                         "reject", why)
        self.qos.reject(delivery_tag, requeue=False)

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        if multiple:
            raise NotImplementedError("DOQ acks one delivery at a time")
        self._settle_tag(delivery_tag, "ack")
        super().basic_ack(delivery_tag)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if self._settle_tag(delivery_tag, "nack" if requeue else "reject"):
            self.qos.reject(delivery_tag, requeue=False)      # DOQ has it back already
        else:
            super().basic_reject(delivery_tag, requeue=requeue)

    def _restore(self, message: Any) -> None:
        """Give back a delivered message that was not acked (at shutdown): nack it."""
        info = message.delivery_info
        if info.get("doq_id") is not None:
            info["doq_touched"] = float("inf")
            try:
                self._settle(info["doq_queue"], int(info["doq_id"]),
                             info.get("doq_delivery", ""), "nack")
            except DoqError:
                pass                   # it comes back when its lease ends anyway
            return
        for key in TAG_KEYS:
            info.pop(key, None)
        super()._restore(message)


def _envelope_problem(payload: Any, codecs: Any) -> str | None:
    """What makes ``payload`` no kombu message (None: kombu may read it): a JSON object with
    text ``body``, ``content-type`` and ``content-encoding``, ``headers`` and ``properties``
    objects (Celery stops at a message without headers), a body encoding kombu knows."""
    if not isinstance(payload, dict):
        return "expected a JSON object"
    if not isinstance(payload.get("properties"), dict):
        return "properties: expected an object"
    encoding = payload["properties"].get("body_encoding")
    if encoding is not None and encoding not in codecs:
        return f"properties.body_encoding: {str(encoding)[:40]!r} is not one kombu knows"
    if not isinstance(payload.get("headers"), dict):
        return "headers: expected an object"
    for key in ("body", "content-type", "content-encoding"):
        if not isinstance(payload.get(key), str):
            return f"{key}: expected text"
    return None


def _eta(value: Any) -> float | None:
    """A Celery eta header (ISO 8601; naive means UTC) as a unix time."""
    if not value:
        return None
    try:
        when = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


class Transport(virtual.Transport):
    """The kombu transport of ``doq://`` (and ``doqs://``) URLs."""

    Channel = Channel
    default_port = 8000                                # type: ignore[assignment]
    driver_type = "doq"
    driver_name = "doq"
    polling_interval = 0.0             # takes long-poll on the server; no sleep between them
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct"]), heartbeats=False)
    # (kombu types these as one-element tuples)
    connection_errors = virtual.Transport.connection_errors + (  # type: ignore[assignment]
        Unavailable,)
    channel_errors = virtual.Transport.channel_errors + (DoqError,)  # type: ignore[assignment]

    def driver_version(self) -> str:
        from importlib import metadata
        try:
            return metadata.version("doq")
        except metadata.PackageNotFoundError:
            return "source"


TRANSPORT_ALIASES.setdefault("doq", "doq_lib.integrations.celery:Transport")
TRANSPORT_ALIASES.setdefault("doqs", "doq_lib.integrations.celery:Transport")
