"""Slow and lossy links between nodes: the delay proxy of tests/slowlinks.py
on its own, then a real 3-node cluster whose Raft links go through it, in a private network
namespace (tests/probes/slowlinks_probe.py)."""
from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.harness import REPO
from tests.slowlinks import DelayProxy

PROBE = os.path.join(REPO, "tests", "probes", "slowlinks_probe.py")


class Echo:
    """A TCP echo server on loopback."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)


def round_trip(sock: socket.socket, payload: bytes) -> float:
    started = time.monotonic()
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "the connection ended"
        got += chunk
    assert got == payload
    return time.monotonic() - started


def test_the_proxy_keeps_order_and_holds_each_way_back() -> None:
    echo = Echo()
    proxy = DelayProxy(0.030, 0.010, seed=2, target=lambda _: ("127.0.0.1", echo.port))
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            # many small writes with random bytes come back whole and in order, although
            # each chunk's hold is drawn at random
            rng = random.Random(5)
            blob = bytes(rng.randrange(256) for _ in range(200_000))
            received = bytearray()

            def read() -> None:
                while len(received) < len(blob):
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    received.extend(chunk)
            reader = threading.Thread(target=read)
            reader.start()
            for i in range(0, len(blob), 997):
                sock.sendall(blob[i:i + 997])
            reader.join(30)
            assert bytes(received) == blob
            # a round trip crosses the proxy twice: at least 2 x (delay - jitter)
            assert min(round_trip(sock, b"ping") for _ in range(5)) >= 0.040
            proxy.set(0.0, 0.0)                        # fast again, same connection
            assert min(round_trip(sock, b"pong") for _ in range(5)) < 0.040
        assert proxy.accepted == 1
    finally:
        proxy.close()
        echo.server.close()


def test_the_proxy_refuses_a_jitter_above_its_delay_and_close_ends_its_connections() -> None:
    echo = Echo()
    proxy = DelayProxy(target=lambda _: ("127.0.0.1", echo.port))
    try:
        with pytest.raises(ValueError, match="jitter"):
            proxy.set(0.010, 0.020)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            round_trip(sock, b"x")
            proxy.close()
            sock.settimeout(5)
            try:
                assert sock.recv(1) == b""                 # ended, not hung
            except ConnectionResetError:
                pass
    finally:
        proxy.close()
        echo.server.close()


@pytest.mark.slow
def test_a_cluster_over_slow_and_lossy_links_loses_nothing_and_slows_gracefully(
        tmp_path: object) -> None:
    for tool in ("unshare", "iptables", "ip"):
        assert shutil.which(tool), f"{tool} is needed for link tests (.ci/run installs it)"
    done = subprocess.run(["unshare", "--net", "--", sys.executable, PROBE, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    phases = out["phases"]
    for name in ("calm", "delay", "healed"):
        assert phases[name]["sent"] > 0 and phases[name]["acked"] == phases[name]["sent"], out
    # every write over the slow links waited for at least one round trip to a follower
    # (2 x (50 - 10) ms), so the delay was really there, and all of them were acknowledged
    assert phases["delay"]["min_ms"] >= 80, out
    assert phases["delay_loss"]["acked"] >= 1 and phases["delay_loss"]["min_ms"] >= 80, out
    assert out["acked_missing"] == [] and out["delivered_twice"] == 0, out
    assert out["replicas_identical"], out
