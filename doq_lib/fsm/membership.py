"""Membership records: the leader's addresses and every member's (L3)."""
from __future__ import annotations

import json

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.state import OK, Ctx, Result
from doq_lib.models import LeaderConfig, MemberInfo

_HEX = frozenset("0123456789abcdef")


def valid_cluster_id(value: object) -> bool:
    """A cluster id: 32 lower-case hex digits (a random 128-bit value)."""
    return isinstance(value, str) and len(value) == 32 and set(value) <= _HEX


def _text(value: object) -> str:
    """A later field of a member record: text, or "" for anything else."""
    return value if isinstance(value, str) else ""


class MembershipOps:
    def __init__(self, sm: MachineState) -> None:
        self.sm = sm

    def cluster_id(self, ctx: Ctx, op: C.ClusterId) -> Result:
        """The first leader of a new cluster names it: the id every node then
        presents in its Raft handshakes, so that a node with another cluster's data is
        refused like a stranger. Set once; a later proposal changes nothing."""
        if not self.sm.cluster_id:
            if not valid_cluster_id(op.cluster_id):
                return ResultCode.BAD_COMMAND, "a cluster id is 32 hex digits"
            self.sm.cluster_id = op.cluster_id
            ctx.txn.put("meta", b"cluster_id", op.cluster_id.encode())
        return OK, self.sm.cluster_id

    def leader_config(self, ctx: Ctx, op: C.PublishLeader) -> Result:
        self.sm.leader = LeaderConfig(op.node_id, op.raft_addr, op.grpc_addr, op.http_addr)
        ctx.txn.put("meta", b"leader", json.dumps(self.sm.leader.__dict__, sort_keys=True).encode())
        return OK, None

    def member_info(self, ctx: Ctx, op: C.PutMember) -> Result:
        node_id, raft_addr = op.node_id, op.raft_addr
        members = dict(self.sm.members)
        for addr, member in self.sm.members.items():      # one entry per id and per address
            if member.node_id == node_id and addr != raft_addr:
                del members[addr]
        members[raft_addr] = MemberInfo(node_id, raft_addr, op.http_addr, op.grpc_addr,
                                        _text(op.client_http_addr), _text(op.client_grpc_addr))
        self._store_members(ctx, members)
        return OK, None

    def member_forget(self, ctx: Ctx, op: C.MemberForget) -> Result:
        members = dict(self.sm.members)
        members.pop(op.raft_addr, None)
        self._store_members(ctx, members)
        return OK, None

    def _store_members(self, ctx: Ctx, members: dict[str, MemberInfo]) -> None:
        encoded = {addr: m.__dict__ for addr, m in sorted(members.items())}
        ctx.txn.put("meta", b"members", json.dumps(encoded, sort_keys=True).encode())
        self.sm.members = members

