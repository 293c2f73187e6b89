"""The fast header parser that replaces pywsgi's email-based one."""
from __future__ import annotations

import io
from http.client import parse_headers

import pytest

from doq_lib.http_server import MAX_HEADERS, FastHeaders


def _parse(raw: bytes) -> FastHeaders:
    return FastHeaders(io.BytesIO(raw), 0)


def test_matches_the_standard_parser_on_a_typical_request() -> None:
    raw = (b"Host: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
           b"Content-Length: 42\r\nX-Custom:  spaced value \r\nAccept: */*\r\n\r\nBODY")
    fast, slow = _parse(raw), parse_headers(io.BytesIO(raw))
    for name in ("host", "Content-Type", "CONTENT-LENGTH", "x-custom", "accept"):
        assert fast.get(name) == slow.get(name).strip()      # pywsgi strips values anyway
    assert fast.get("missing") is None
    assert fast.typeheader == "application/json"
    assert list(fast.headers) == [f"{k}: {v.strip()}\r\n" for k, v in slow.items()]
    assert fast.status == ""


def test_stops_at_the_blank_line_and_leaves_the_body() -> None:
    stream = io.BytesIO(b"A: 1\r\n\r\nrest")
    FastHeaders(stream)
    assert stream.read() == b"rest"


def test_first_value_wins_and_delete_removes_all() -> None:
    h = _parse(b"Content-Length: 5\r\ncontent-length: 7\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert h.get("Content-Length") == "5"
    del h["content-length"]
    assert h.get("content-length") is None and "content-length" not in h
    assert list(h.headers) == ["Transfer-Encoding: chunked\r\n"]


def test_folded_continuation_lines_join_the_previous_value() -> None:
    assert _parse(b"X-Long: part one\r\n  part two\r\n\r\n").get("x-long") == "part one part two"


@pytest.mark.parametrize(("raw", "status"), [
    (b"no colon here\r\n\r\n", "Invalid header line"),
    (b"Bad Name : x\r\n\r\n", "Invalid header line"),
    (b"X: " + b"a" * 70000 + b"\r\n\r\n", "Line too long"),
    (b"".join(b"H%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n", "Too many headers"),
])
def test_malformed_headers_set_a_status(raw: bytes, status: str) -> None:
    assert _parse(raw).status == status
