"""Node addresses as the tools and clients take them (``--url``, ``connect(urls)``)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from doq_lib.client.common import parse_url
from doq_lib.errors import InvalidArgument
from tests.harness import DOQ


@pytest.mark.parametrize(("url", "parsed"), [
    ("127.0.0.1:8000", ("http", "127.0.0.1", 8000)),
    ("http://node-0:8000", ("http", "node-0", 8000)),
    ("https://[::1]:8443", ("https", "::1", 8443)),
    ("grpc://h:10000", ("grpc", "h", 10000)),
])
def test_an_address_without_a_scheme_is_taken_as_the_default_one(
        url: str, parsed: tuple[str, str, int]) -> None:
    assert parse_url(url, "http") == parsed


@pytest.mark.parametrize("url", ["localhost", "http://localhost", "h:0", "h:99999",
                                 "http://:8000", ""])
def test_a_bad_address_is_refused_in_the_users_words(url: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_url(url, "http")
    assert str(caught.value) == \
        f"bad node address {url!r}: expected http://host:port (or host:port)"


def test_the_cli_says_what_is_wrong_with_an_address() -> None:
    done = subprocess.run([sys.executable, DOQ, "backup", "--url", "h:99999", "--output",
                           "unused.bak"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "bad node address 'h:99999': expected http://host:port (or host:port)" in \
        done.stderr


def test_grpc_targets_put_the_names_that_resolve_first() -> None:
    from doq_lib.client.common import grpc_targets
    from doq_lib.errors import Unavailable
    from doq_lib.models import ServerInfo

    def member(grpc: str, leader: bool = False) -> ServerInfo:
        return ServerInfo(grpc, grpc, "", leader, grpc_addr=grpc)

    listed = [member("node-0.invalid:10000", leader=True), member("127.0.0.1:10001"),
              member("[::1]:10002"), member("", False)]
    targets, leader = grpc_targets(listed, "https")
    assert targets == ["grpcs://127.0.0.1:10001", "grpcs://[::1]:10002",
                       "grpcs://node-0.invalid:10000"]
    assert leader is None                  # the leader's name cannot be used from here
    assert grpc_targets([member("localhost:1", leader=True)], "http") == \
        (["grpc://localhost:1"], "localhost:1")
    with pytest.raises(Unavailable, match="node-0.invalid:10000, node-1.invalid:10000"):
        grpc_targets([member("node-0.invalid:10000"), member("node-1.invalid:10000")], "http")
    with pytest.raises(Unavailable, match="serves no gRPC"):
        grpc_targets([member("")], "http")
