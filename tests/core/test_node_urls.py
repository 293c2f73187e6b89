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
