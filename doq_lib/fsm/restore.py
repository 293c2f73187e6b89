"""Restores: chunks staged through the log, then applied in one step (L3)."""
from __future__ import annotations

from typing import Callable

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.state import INT63_MAX, OK, Ctx, Result
from doq_lib.lmdb_store import LmdbTxn
from doq_lib.store import TRACKED, TRACKED_NAMES, U64, encode_clock


class RestoreOps:
    def __init__(self, sm: MachineState, reload: Callable[[LmdbTxn], None]) -> None:
        self.sm = sm
        self.reload = reload            # StateMachine.reload: every index from the store

    def _restore_token(self, ctx: Ctx) -> str:
        raw = ctx.txn.get("meta", b"restore")
        return raw.decode() if raw else ""

    def begin(self, ctx: Ctx, op: C.RestoreToken) -> Result:
        ctx.txn.clear_staging()
        ctx.txn.put("meta", b"restore", op.token.encode())
        return OK, None

    def put(self, ctx: Ctx, op: C.RestorePut) -> Result:
        records = op.records
        if self._restore_token(ctx) != op.token:
            return ResultCode.RESTORE_CONFLICT, "another restore started since; this one stopped"
        for code, key, value in records:
            if code not in TRACKED_NAMES:
                return ResultCode.BAD_COMMAND, f"unknown database code {code}"
            ctx.txn.stage(code, key, value)
        return OK, len(records)

    def commit(self, ctx: Ctx, op: C.RestoreCommit) -> Result:
        full, since, last_version, last_id, next_qid = \
            op.full, op.since, op.last_version, op.last_id, op.next_qid
        txn = ctx.txn
        if self._restore_token(ctx) != op.token:
            return ResultCode.RESTORE_CONFLICT, "another restore started since; this one stopped"
        if not (0 <= last_id <= INT63_MAX and 1 <= next_qid <= INT63_MAX):
            return ResultCode.BAD_COMMAND, "restore counters out of range"
        if not full and self.sm.restored_version != since - 1:
            ended = ("no restore was made here" if self.sm.restored_version is None
                     else f"the last restore here ended at version {self.sm.restored_version}")
            return ResultCode.RESTORE_CONFLICT, (
                f"an incremental backup from version {since} must follow the restore that "
                f"ended at version {since - 1}, but {ended}")
        if full:
            for name in TRACKED:
                txn.delete_prefix(name, b"")
        for code, key, value in txn.staged():
            name = TRACKED_NAMES[code]
            if value is None:
                txn.delete(name, key)
            else:
                txn.put(name, key, value)
        txn.clear_staging()
        txn.delete("meta", b"restore")
        txn.put("meta", b"restored", U64.pack(last_version))
        self.sm.last_id = max(self.sm.last_id, last_id)
        txn.put("meta", b"clock", encode_clock(self.sm.last_now_ms, self.sm.last_id))
        txn.put("meta", b"next_qid", U64.pack(max(self.sm.next_qid, next_qid)))
        self.reload(txn)                        # every in-memory index from the new state
        self.sm.touched.clear()
        self.sm.woken.update(self.sm.queues)
        return OK, {"queues": len(self.sm.queues)}

    def abort(self, ctx: Ctx, op: C.RestoreToken) -> Result:
        if self._restore_token(ctx) == op.token:
            ctx.txn.clear_staging()
            ctx.txn.delete("meta", b"restore")
        return OK, None

