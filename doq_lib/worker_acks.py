"""The acks of ``doq worker``'s runs, sent in batches while the runs go on.

A run that returns hands its ack (and the follow-ups it added) to its queue's
:class:`AckBatcher` and its slot is free at once; the batcher's thread sends what gathered
while the previous batch was on its way as one batch ack: one operation on the cluster, each
id all or nothing with its follow-ups, each fenced by its delivery token. This is how an AMQP
consumer's acks work (sent without waiting), and it keeps the at-least-once promise: an ack
not yet durable when the worker is killed leaves its message to come back after its lease,
as a run cut off would. A stopping worker sends what is pending before it exits.

A batch whose outcome is unknown (a leader election) is sent again with the same tokens for
up to ``SETTLE_RETRY`` seconds: an id that the first attempt did ack is then refused as
stale, and counts as acked. An id refused on the first attempt lost its lease (another
worker has the message), which is logged. When ``most_pending`` acks wait (the cluster is
unreachable), runs wait to hand theirs over.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from doq_lib.errors import DoqError, NotUnacked, StaleDelivery, Unavailable
from doq_lib.models import Message

log = logging.getLogger("doq.worker")

SETTLE_RETRY = 30.0       # seconds an ack whose outcome is unknown is sent again
MOST_PER_REQUEST = 256    # acks in one request at most


def settle_once(settle: Callable[[], Any], message: Message) -> bool:
    """Settle ``message`` (``settle()``): whether that took effect. One whose outcome is
    unknown (the cluster was electing a leader) is sent again with the same delivery token
    for up to SETTLE_RETRY seconds: if the first did apply, the next is refused (stale, or
    not found once the message is gone), and it took effect. A lost lease (another worker
    has the message) or a refusal is logged."""
    deadline = time.monotonic() + SETTLE_RETRY
    tried = False
    while True:
        try:
            settle()
            return True
        except (StaleDelivery, NotUnacked):
            if tried:
                return True                # the earlier attempt did apply
            log.warning("message %s of %s: its lease was lost before it was settled (another "
                        "worker has it, or it is gone)", message.id, getattr(message, "queue", ""))
            return False
        except Unavailable as exc:
            tried = True
            if time.monotonic() > deadline:
                log.error("message %s could not be settled: %s", message.id, exc)
                return False
            time.sleep(0.5)
        except DoqError as exc:
            log.error("message %s could not be settled: %s", message.id, exc)
            return False


@dataclass
class _Ack:
    message: Message                      # its id and delivery token are what count
    follow_ups: list[dict[str, Any]]
    task: str
    deadline: float
    tried: bool = False


class AckBatcher:
    """One queue's acks, sent in batches by a thread of their own (see the module notes).
    ``done(task, applied)`` is called once per ack: applied, or refused / given up."""

    def __init__(self, client: Any, queue: str, done: Callable[[str, bool], None],
                 most_pending: int = 1024) -> None:
        self.client, self.queue, self._done = client, queue, done
        self._most = max(1, most_pending)
        self._pending: list[_Ack] = []
        self._sending = 0
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"doq-acks-{queue}")
        self._thread.start()

    def ack(self, message: Message, follow_ups: list[dict[str, Any]], task: str) -> None:
        """Queue the ack of ``message`` (with ``follow_ups``); waits only while too many are
        pending."""
        with self._ready:
            while len(self._pending) >= self._most and not self._closed:
                self._ready.wait(0.5)
            self._pending.append(_Ack(message, follow_ups, task,
                                      time.monotonic() + SETTLE_RETRY))
            self._ready.notify_all()

    def has_room(self) -> bool:
        """Whether :meth:`ack` would return at once (for callers that must not block)."""
        with self._ready:
            return len(self._pending) < self._most

    @property
    def pending(self) -> int:
        """Acks not yet known to be durable."""
        with self._ready:
            return len(self._pending) + self._sending

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending:
                    return
                batch = self._pending[:MOST_PER_REQUEST]
                del self._pending[:MOST_PER_REQUEST]
                self._sending = len(batch)
                self._ready.notify_all()
            try:
                again = self._send(batch)
            finally:
                with self._ready:
                    self._sending = 0
            if again:
                time.sleep(0.5)
                with self._ready:
                    self._pending[:0] = again
                    self._ready.notify_all()

    def _send(self, batch: list[_Ack]) -> list[_Ack]:
        """Send ``batch``; what should be sent again (its outcome unknown)."""
        try:
            settled = self.client.ack_many(
                self.queue, [a.message.id for a in batch], [a.message.delivery for a in batch],
                [a.follow_ups for a in batch] if any(a.follow_ups for a in batch) else None)
        except Unavailable as exc:
            now = time.monotonic()
            again = [a for a in batch if now < a.deadline]
            for a in batch:
                a.tried = True
                if now >= a.deadline:
                    log.error("message %s of %s could not be acked: %s", a.message.id,
                              self.queue, exc.message)
                    self._done(a.task, False)
            return again
        except DoqError as exc:
            for a in batch:
                log.error("message %s of %s could not be acked: %s", a.message.id, self.queue,
                          exc.message)
                self._done(a.task, False)
            return []
        failed = {f.id: f for f in settled.failed}
        for a in batch:
            failure = failed.get(a.message.id)
            if failure is None or a.tried:         # (refused after a lost answer: applied)
                self._done(a.task, True)
            else:
                log.warning("message %s of %s: its lease was lost before it was acked; "
                            "another worker has it (%s)", a.message.id, self.queue,
                            failure.detail)
                self._done(a.task, False)
        return []

    def close(self) -> None:
        """Send what is pending (retrying within its deadline), then stop."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        self._thread.join(timeout=SETTLE_RETRY + 10)
