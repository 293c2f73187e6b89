"""Journal fsyncs through Linux native AIO, completed in the event loop (L3).

A journal sync in a Python thread costs two GIL hand-offs: the thread needs the interpreter to
start the fdatasync and again to report it, and the event loop's thread holds the interpreter
whenever the node is busy. Under load (and on two cores shared by several processes) a sync of
0.4 ms then took 3-5 ms before the loop learnt of it, and while the worker held the GIL and was
preempted, the whole node stood still.

Here the kernel does the sync: ``io_submit`` with ``IOCB_CMD_FDSYNC`` (Linux 4.18 or later runs
it in a kernel worker, for every filesystem) returns at once, and the completion is signalled
on an eventfd that the event loop watches like any socket. No Python thread is involved, so
nothing competes for the interpreter. :func:`available` tells whether this kernel (or a
seccomp filter in front of it) allows it; the node falls back to
:class:`~doq_lib.raft.syncer.SyncThread` otherwise.

The syscalls are made through ``ctypes`` (``syscall(2)``): Python has no binding for them.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct
from typing import Any, Callable

import gevent

log = logging.getLogger(__name__)

Done = Callable[[bool], None]
# syscall numbers: io_setup, io_destroy, io_getevents, io_submit
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
IOCB_CMD_FDSYNC = 3
IOCB_FLAG_RESFD = 1
# struct iocb: data, key, rw_flags, opcode, reqprio, fildes, buf, nbytes, offset, reserved2,
# flags, resfd (64 bytes, little endian on both architectures above)
_IOCB = struct.Struct("<QIiHhIQQqQII")
_EVENT = struct.Struct("<QQqq")            # struct io_event: data, obj, res, res2
MAX_EVENTS = 64

_libc: Any = None


def _syscall(number: int, *args: Any) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(result)


class AioSync:
    """fdatasync requests on file descriptors, answered in the event loop in order of
    completion; ``submit(os.fdatasync, (fd,), done)`` has the shape of
    :meth:`SyncThread.submit` (only fdatasync is accepted)."""

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None:
            raise OSError(errno.ENOSYS, f"native AIO numbers unknown on {platform.machine()}")
        self._setup, self._destroy, self._getevents, self._submit = numbers
        ctx = ctypes.c_ulong(0)
        _syscall(self._setup, ctypes.c_long(MAX_EVENTS), ctypes.byref(ctx))
        self._ctx = ctx
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._events = ctypes.create_string_buffer(_EVENT.size * MAX_EVENTS)
        self._pending: dict[int, tuple[Any, Done]] = {}    # request number -> (iocb, done)
        self._next = 1
        self._watcher = gevent.get_hub().loop.io(self._efd, 1)
        self._watcher.start(self._completed)
        self.jobs_run = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Done) -> None:
        if fn is not os.fdatasync or len(args) != 1:
            raise ValueError("AioSync runs os.fdatasync(fd) only")
        if len(self._pending) >= MAX_EVENTS:
            raise OSError(errno.EAGAIN, "too many syncs in flight")
        number, self._next = self._next, self._next + 1
        iocb = ctypes.create_string_buffer(_IOCB.size)
        _IOCB.pack_into(iocb, 0, number, 0, 0, IOCB_CMD_FDSYNC, 0, args[0], 0, 0, 0, 0,
                        IOCB_FLAG_RESFD, self._efd)
        pointers = (ctypes.c_void_p * 1)(ctypes.addressof(iocb))
        _syscall(self._submit, self._ctx, ctypes.c_long(1), pointers)
        self._pending[number] = (iocb, done)

    def _completed(self) -> None:                 # the event loop: the eventfd is readable
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            return
        while self._pending:
            got = _syscall(self._getevents, self._ctx, ctypes.c_long(0),
                           ctypes.c_long(MAX_EVENTS), self._events, None)
            if not got:
                return
            for n in range(got):
                number, _, res, _ = _EVENT.unpack_from(self._events, n * _EVENT.size)
                _, done = self._pending.pop(number, (None, None))
                if done is None:
                    continue
                if res < 0:
                    log.error("journal fdatasync failed: %s", os.strerror(-res))
                self.jobs_run += 1
                done(res >= 0)

    def stop(self) -> None:
        """Wait (briefly) for syncs in flight, then release the AIO context."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            got = _syscall(self._getevents, self._ctx, ctypes.c_long(len(self._pending)),
                           ctypes.c_long(MAX_EVENTS), self._events, None)
            for n in range(got):
                number, _, res, _ = _EVENT.unpack_from(self._events, n * _EVENT.size)
                entry = self._pending.pop(number, None)
                if entry is not None:
                    entry[1](res >= 0)
        self._watcher.stop()
        self._watcher.close()
        _syscall(self._destroy, self._ctx)
        os.close(self._efd)


def available(directory: str) -> bool:
    """Whether an AIO fdatasync works here (kernel, seccomp, filesystem of ``directory``)."""
    path = os.path.join(directory, ".doq-aio-probe")
    try:
        syncer = AioSync()
    except OSError as exc:
        log.info("native AIO is not available (%s): journal syncs use a thread", exc)
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"probe")
        results: list[bool] = []
        try:
            syncer.submit(os.fdatasync, (fd,), results.append)
        except OSError as exc:
            log.info("native AIO fdatasync is refused here (%s): journal syncs use a thread",
                     exc)
            return False
        syncer.stop()                               # waits for the probe's completion
        return results == [True]
    finally:
        os.close(fd)
        os.unlink(path)
        if not syncer._closed:
            syncer.stop()
