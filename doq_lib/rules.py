"""The domain's rules, one definition each (layer 0).

What a queue name, a queue type, queue settings, a message id and a priority may be. The state
machine relies on them, and both transports check a request against them before anything is
proposed; a transport keeps only the checks of its own wire (JSON types, protobuf field
presence, query syntax) and its own wording of a problem (SPEC §3.1 for HTTP).
"""
from __future__ import annotations

import enum

MAX_NAME = 1024                   # characters of a queue name (SPEC §3.2)
QUEUE_TYPES = ("delayed", "fair")

# Ack timeouts, in seconds. 0 means the configured default (queue.default_acknowledgement_
# timeout). The original DOQ accepts 10 and more over gRPC, but its HTTP API asks for at least
# 60 and refuses an explicit 0 (SPEC §2 and §3.4); both are kept, as the wire contract.
MIN_ACK_TIMEOUT = 10
HTTP_MIN_ACK_TIMEOUT = 60
MAX_ACK_TIMEOUT = 2 ** 32 - 1
FALLBACK_ACK_TIMEOUT = 1800       # the default of an operation written before it carried one

MAX_UNACKED = 2 ** 32 - 1         # fair queues: in flight per group (0: unlimited)
MAX_PRIORITY = 2 ** 63 - 1        # priorities are non-negative int64
MAX_ID = 2 ** 63 - 1              # message ids: positive int64 (0 asks for a new one)


class NameProblem(enum.Enum):
    EMPTY = "empty"
    TOO_LONG = "too long"
    SLASH = "contains '/'"


def name_problem(name: str) -> NameProblem | None:
    """What is wrong with ``name`` as a queue name (None: nothing)."""
    if not name:
        return NameProblem.EMPTY
    if len(name) > MAX_NAME:
        return NameProblem.TOO_LONG
    if "/" in name:
        return NameProblem.SLASH
    return None


#: How each transport words a name problem (HTTP: SPEC §3.1's wording; gRPC names the field).
NAME_WORDING = {
    "http": {NameProblem.EMPTY: "expected length >= 1",
             NameProblem.TOO_LONG: f"expected length <= {MAX_NAME}",
             NameProblem.SLASH: "expected a name without '/'"},
    "grpc": {NameProblem.EMPTY: "{field} is required",
             NameProblem.TOO_LONG: f"{{field}} is longer than {MAX_NAME} characters",
             NameProblem.SLASH: "{field} must not contain '/'"},
}


def name_message(name: str, transport: str, field: str = "") -> str | None:
    """What is wrong with ``name``, in ``transport``'s words (None: nothing)."""
    problem = name_problem(name)
    return None if problem is None else NAME_WORDING[transport][problem].format(field=field)


def ack_timeout_allowed(seconds: int, minimum: int = MIN_ACK_TIMEOUT) -> bool:
    """0 (the default) or from ``minimum`` to MAX_ACK_TIMEOUT."""
    return seconds == 0 or minimum <= seconds <= MAX_ACK_TIMEOUT
