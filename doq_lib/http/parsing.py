"""Reading a request (L5): JSON bodies against their schemas, query parameters, path ids and
names, uploads spooled to disk; each problem a 4xx naming what is wrong."""
from __future__ import annotations

import json
import re
import tempfile
from typing import IO, Any

from doq_lib import rules
from doq_lib.http.calls import CURRENT_CALL, FALSE_VALUES, MAX_BODY, TRUE_VALUES, HttpProblem
from doq_lib.http.framing import Refused
from doq_lib.http.schema import SCHEMAS, UINT64_MAX, normalized, validate


def _check_content_type() -> None:
    """A JSON body must say so: a form or text/plain post (what another site's page can
    send without asking) is not a JSON request."""
    ctype = CURRENT_CALL.get().request_content_type.split(";")[0].strip()
    if ctype != "application/json" and not ctype.endswith("+json"):
        message = (f"unsupported content type {ctype!r}: use application/json" if ctype
                   else "the request has a body but no Content-Type: send "
                        "'Content-Type: application/json'")
        raise HttpProblem(415, "validation failed", [{
            "message": message, "location": "header.Content-Type", "value": ctype}])


def _read_body() -> bytes:
    call = CURRENT_CALL.get()
    if call.content_length >= MAX_BODY:
        raise HttpProblem(413, f"request body is too large limit={MAX_BODY} bytes")
    try:
        # The server decodes a chunked body; a Content-Length one is read to its length.
        raw = call.body()
    except TimeoutError as exc:                   # the server's http.body_timeout
        raise HttpProblem(408, str(exc)) from None
    except Refused as exc:                        # the server's http.max_held_bytes
        raise HttpProblem(exc.status, exc.message) from None
    except (OSError, ValueError) as exc:
        raise HttpProblem(400, "validation failed", [
            {"message": f"cannot read the request body: {exc}", "location": "body"}]) from None
    if len(raw) >= MAX_BODY:
        raise HttpProblem(413, f"request body is too large limit={MAX_BODY} bytes")
    return raw


def json_body(schema_name: str, required: bool = True) -> dict[str, Any]:
    """The validated body of a route; an optional one may be absent or empty ({})."""
    raw = _read_body()
    if not raw.strip():
        if not required:
            return {}
        raise HttpProblem(400, "request body is required")
    _check_content_type()
    try:
        # What json.loads does with these hooks, without building a decoder per request.
        value = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise HttpProblem(400, "validation failed", [{
            "message": str(exc), "location": "body",
            "value": raw.decode("utf-8", "replace")}]) from None
    return _checked(schema_name, value)


def _checked(schema_name: str, value: Any) -> dict[str, Any]:
    """``value`` held to schema ``schema_name`` (a 422 with every problem), normalized."""
    schema = SCHEMAS[schema_name]
    problems = validate(schema, value)
    if problems:
        raise HttpProblem(422, "validation failed", problems)
    return normalized(schema, value)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {text}")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"invalid JSON value: {text}")   # NaN / Infinity are not JSON


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)


def decimal_of(raw: str) -> int | None:
    """A decimal string of at most 20 digits (every uint64) as an int, else None: longer
    ones are refused before int() (which raises past 4300 digits)."""
    if raw.isascii() and raw.isdigit() and len(raw) <= 20:
        return int(raw)
    return None


def path_id(raw: str) -> int:
    value = decimal_of(raw)
    if value is not None and value <= UINT64_MAX:
        return value
    raise HttpProblem(422, "validation failed", [
        {"message": "invalid integer", "location": "path.id", "value": raw}])


def query_flag(name: str) -> bool:
    """A boolean query parameter: absent or empty is false; anything but the spellings of
    true and false is a 422, never read as false (``?browse=yes`` must not dequeue)."""
    raw = CURRENT_CALL.get().query(name)
    if raw is None or raw == "":
        return False
    if raw in TRUE_VALUES:
        return True
    if raw in FALSE_VALUES:
        return False
    raise HttpProblem(422, "validation failed", [        # the original's wording (SPEC §3)
        {"message": "invalid boolean", "location": f"query.{name}", "value": raw}])


def query_ack() -> bool:
    return query_flag("ack")


MAX_TAKE = 1000            # messages per GET ?count=N
MAX_WAIT = 20.0            # seconds a GET ?wait=S may wait
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\Z")


def query_count() -> int | None:
    raw = CURRENT_CALL.get().query("count")
    if raw is None:
        return None
    value = decimal_of(raw)
    if value is not None and 1 <= value <= MAX_TAKE:
        return value
    raise HttpProblem(422, "validation failed", [{
        "message": f"expected an integer from 1 to {MAX_TAKE}", "location": "query.count",
        "value": raw}])


def query_wait() -> float | None:
    raw = CURRENT_CALL.get().query("wait")
    if raw is None:
        return None
    if _DECIMAL.match(raw) and float(raw) <= MAX_WAIT:
        return float(raw)
    raise HttpProblem(422, "validation failed", [{
        "message": f"expected seconds from 0 to {MAX_WAIT:g} (decimals allowed)",
        "location": "query.wait", "value": raw}])


def batch_ids(raw_ids: list[Any]) -> list[int]:
    """The ids of a batch ack / nack body: decimal strings or integers, each once."""
    ids: list[int] = []
    first: dict[int, int] = {}
    problems = []
    for n, raw in enumerate(raw_ids):
        where = f"body.ids[{n}]"
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, str):
            value = decimal_of(raw)
        if value is None:
            problems.append({"message": "expected a message id: a decimal string or an "
                             "integer", "location": where, "value": raw})
            continue
        if not 0 <= value <= UINT64_MAX:
            problems.append({"message": "expected a message id below 2^64", "location": where,
                             "value": raw})
        elif value in first:
            problems.append({"message": f"duplicate id (also body.ids[{first[value]}])",
                             "location": where, "value": raw})
        else:
            first[value] = n
            ids.append(value)
    if problems:
        raise HttpProblem(422, "validation failed", problems)
    return ids


def query_consumer() -> str:
    """The consumer a dequeue names (``?consumer=``; "": unnamed)."""
    raw = CURRENT_CALL.get().query("consumer") or ""
    problem = rules.consumer_problem(raw)
    if problem is not None:
        raise HttpProblem(422, "validation failed", [{
            "message": problem, "location": "query.consumer", "value": raw}])
    return raw


def settle_ids(raw_ids: list[Any]) -> tuple[list[int], list[rules.Token | None] | None]:
    """The items of a batch ack / nack body, each a message id or ``{"id", "delivery"}``:
    the ids, and each one's delivery token (None for the whole when no item carries one)."""
    plain = [raw.get("id") if isinstance(raw, dict) else raw for raw in raw_ids]
    ids = batch_ids(plain)
    tokens: list[rules.Token | None] = []
    problems = []
    for n, (mid, raw) in enumerate(zip(ids, raw_ids)):
        text = raw.get("delivery") if isinstance(raw, dict) else None
        if text is None:
            tokens.append(None)
            continue
        problem = rules.token_problem(text, mid)
        if problem is not None:
            problems.append({"message": problem, "location": f"body.ids[{n}].delivery",
                             "value": text})
            continue
        tokens.append(rules.parse_token(text, mid)[1])
    if problems:
        raise HttpProblem(422, "validation failed", problems)
    return ids, tokens if any(t is not None for t in tokens) else None


def delivery_of(mid: int, body: dict[str, Any] | None) -> rules.Token | None:
    """The delivery token a settle of message ``mid`` carries: ``"delivery"`` in its body
    or ``?delivery=`` (None: none; both given must agree)."""
    in_body = body.get("delivery") if body else None
    in_query = CURRENT_CALL.get().query("delivery")
    if in_body is not None and in_query is not None and in_body != in_query:
        raise HttpProblem(422, "validation failed", [{
            "message": "the body and the query name different deliveries: give one",
            "location": "query.delivery", "value": in_query}])
    text, where = (in_body, "body.delivery") if in_body is not None else \
        (in_query, "query.delivery")
    if text is None:
        return None
    problem = rules.token_problem(text, mid)
    if problem is not None:
        raise HttpProblem(422, "validation failed", [{
            "message": problem, "location": where, "value": text}])
    return rules.parse_token(text, mid)[1]


def settle_body(items: bool = True) -> dict[str, Any] | None:
    """The body of a route whose body the original ignores (ack, touch): a JSON object
    with ``delivery`` (or, ``items``, ``enqueue``) is read and checked (SettleInputBody);
    anything else stays ignored."""
    raw = _read_body()
    if not raw.strip():
        return None
    try:
        value = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict) or not ({"delivery", "enqueue"} if items else
                                           {"delivery"}) & set(value):
        return None
    if not items:
        return {"delivery": value["delivery"]}
    _check_content_type()
    return _checked("SettleInputBody", value)


def check_queue_name(name: str, location: str = "body.name", new: bool = False) -> None:
    """``new``: the name of a queue to create (held to every rule of a name)."""
    message = rules.name_message(name, "http", new=new)
    if message is not None:
        raise HttpProblem(422, "validation failed", [
            {"message": message, "location": location, "value": name}])


def enqueue_id(raw: Any, location: str = "body.id") -> int:
    """Enqueue ``id``: absent, empty or "0" means "generate one"."""
    if raw in (None, "", "0"):
        return 0
    value = decimal_of(raw)
    if value is not None and value < 2 ** 63:
        return value
    raise HttpProblem(422, "validation failed", [{
        "message": "expected a decimal message id below 2^63", "location": location,
        "value": raw}])


def spool_body() -> IO[bytes]:
    """The request body in a temporary file (any size; memory stays bounded)."""
    call = CURRENT_CALL.get()
    source = call.environ["wsgi.input"]
    remaining = None if call.chunked else call.content_length
    spool = tempfile.TemporaryFile()
    try:
        while remaining is None or remaining > 0:
            block = source.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not block:
                break
            spool.write(block)
            if remaining is not None:
                remaining -= len(block)
    except TimeoutError as exc:
        spool.close()
        raise HttpProblem(408, str(exc)) from None
    except Refused as exc:
        spool.close()
        raise HttpProblem(exc.status, exc.message) from None
    except (OSError, ValueError) as exc:
        spool.close()
        raise HttpProblem(400, "validation failed", [
            {"message": f"cannot read the request body: {exc}", "location": "body"}]) from None
    spool.seek(0)
    return spool


def check_path_names(kwargs: dict[str, str]) -> None:
    name = kwargs.get("queue_name")
    # A path segment has no '/' and is never empty; only text beyond ASCII can be broken.
    if name is not None and (len(name) > rules.MAX_NAME or not name.isascii()):
        check_queue_name(name, "path.queue_name")

