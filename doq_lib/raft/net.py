"""Outgoing Raft connections from a chosen source address (L3).

PySyncObj binds its listening socket (``bindAddress``) but lets the kernel pick the source of
its outgoing connections. On a multi-homed host that can be the wrong interface, and on a
shared loopback (nodes on 127.0.0.11-13) every connection would come from 127.0.0.1, so a
firewall could not tell nodes apart. :func:`bind_outgoing` makes every outgoing Raft socket of
this process start from the node's own Raft host.
"""
from __future__ import annotations

import ipaddress

from doq_lib.raft import wire


def source_host(address: str) -> str | None:
    """The host part of ``address`` if it is a specific IPv4/IPv6 address, else None."""
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None                       # a name (e.g. localhost): leave routing alone
    return None if ip.is_unspecified else host


def bind_outgoing(host: str | None) -> None:
    """Bind this process's outgoing Raft sockets to ``host`` (None: the kernel's choice)."""
    wire.set_outgoing_source(host)
