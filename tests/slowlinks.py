"""Slow links between nodes without netem: a userspace delay proxy on the Raft connections.

This kernel has no ``sch_netem`` (``tc qdisc add ... netem`` answers "Specified qdisc kind is
unknown"), so delay and jitter are made in userspace. Inside a private network namespace,
iptables' ``nat`` table sends every new TCP connection from one node's address to another
node's Raft port to :class:`DelayProxy`, which reads the original destination back
(``SO_ORIGINAL_DST``) and connects to it *from the same source address* (any 127/8 address is
local), with a firewall mark that exempts it from the redirect. So the proxy's leg looks to
iptables like the direct link: the partition and packet-loss rules between node addresses
(scripts/chaos.py) apply to it unchanged. The proxy forwards the bytes each way, holding each
chunk back by ``delay`` plus or minus ``jitter`` seconds; order within a connection is kept,
as TCP keeps it (a chunk never overtakes the one before it). Loss on top comes from
iptables' ``statistic`` match, so TCP retransmits as it would over a lossy wire.

:class:`LinkProxy` installs the rules before the nodes start (no connection ever bypasses the
proxy, none has to be reset) and runs the proxy in a process of its own, so that the caller's
threads do not slow it; ``set(delay, jitter)`` turns the links slow and back (0, 0). Only for
use inside a namespace of the tests' own (scripts/chaos.py, tests/probes/slowlinks_probe.py).

    python tests/slowlinks.py serve MARK     # the proxy process: prints its port, then reads
                                             # "delay jitter" lines, answers "ok" to each
"""
from __future__ import annotations

import collections
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Callable

SO_ORIGINAL_DST = 80                 # linux/netfilter_ipv4.h
SO_MARK = getattr(socket, "SO_MARK", 36)
MARK = 0x5107                        # the proxy's own connections carry it: never redirected
CHUNK = 65536


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a connection redirected by iptables (REDIRECT/DNAT) was going to."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


class _Pipe:
    """One direction of one connection: a reader that stamps each chunk with the time it may
    go, and a writer that sends it then."""

    def __init__(self, src: socket.socket, dst: socket.socket, proxy: "DelayProxy") -> None:
        self.src, self.dst, self.proxy = src, dst, proxy
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.cond = threading.Condition()
        self.eof = False
        for target in (self._read, self._write):
            threading.Thread(target=target, daemon=True).start()

    def _read(self) -> None:
        last = 0.0
        try:
            while not self.proxy.closed:
                data = self.src.recv(CHUNK)
                if not data:
                    break
                due = max(last, time.monotonic() + self.proxy.hold())
                last = due
                with self.cond:
                    self.queue.append((due, data))
                    self.cond.notify()
        except OSError:
            pass
        with self.cond:
            self.eof = True
            self.cond.notify()

    def _write(self) -> None:
        try:
            while not self.proxy.closed:
                with self.cond:
                    while not self.queue and not self.eof and not self.proxy.closed:
                        self.cond.wait(0.5)
                    if not self.queue:
                        break                          # end of stream, all of it sent
                    due, data = self.queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self.dst.sendall(data)
                with self.cond:
                    self.queue.popleft()
        except OSError:
            pass
        self.proxy.drop(self.src, self.dst)


class DelayProxy:
    """Accepts connections on ``listen`` and forwards each to ``target(sock)`` (by default the
    destination iptables redirected it from), from the client's own address when ``mark`` is
    set (the mark exempts that connection from the redirect), each chunk held back by
    ``delay`` ± ``jitter`` seconds (changed at any time by :meth:`set`)."""

    def __init__(self, delay: float = 0.0, jitter: float = 0.0, seed: int = 0,
                 listen: tuple[str, int] = ("127.0.0.1", 0),
                 target: Callable[[socket.socket], tuple[str, int]] = original_destination,
                 mark: int = 0) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.set(delay, jitter)
        self.target, self.mark = target, mark
        self.closed = False
        self.socks: set[socket.socket] = set()
        self.accepted = 0
        self.server = socket.create_server(listen)
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, delay: float, jitter: float) -> None:
        if not 0 <= jitter <= delay:
            raise ValueError(f"need 0 <= jitter <= delay (delay {delay}, jitter {jitter})")
        with self.lock:
            self.delay, self.jitter = delay, jitter

    def hold(self) -> float:
        with self.lock:
            return self.delay + self.rng.uniform(-self.jitter, self.jitter) if self.delay else 0.0

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._open, args=(conn,), daemon=True).start()

    def _open(self, conn: socket.socket) -> None:
        out = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            where = self.target(conn)
            if self.mark:
                out.setsockopt(socket.SOL_SOCKET, SO_MARK, self.mark)
                out.bind((conn.getpeername()[0], 0))
            out.settimeout(5)
            out.connect(where)
            out.settimeout(None)
        except OSError:
            conn.close()
            out.close()
            return
        for s in (conn, out):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.lock:
            if self.closed:
                conn.close()
                out.close()
                return
            self.socks |= {conn, out}
            self.accepted += 1
        _Pipe(conn, out, self)
        _Pipe(out, conn, self)

    def drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with self.lock:
                self.socks.discard(s)
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.closed = True
        self.server.close()
        with self.lock:
            socks = list(self.socks)
        self.drop(*socks)


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


class LinkProxy:
    """The Raft links between ``nodes`` (``(host, raft_port)`` pairs) through a
    :class:`DelayProxy` in a child process. Start it before the nodes; ``set(delay, jitter)``
    makes every link slow (seconds each way) or fast again (0, 0); ``close()`` removes the
    rules and ends the proxy. Needs root in a network namespace of the caller's own."""

    def __init__(self, nodes: list[tuple[str, int]], seed: int = 0) -> None:
        self.rules: list[list[str]] = []
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", str(MARK), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.port = int(self._line())
            for host, _ in nodes:
                for other, port in nodes:
                    if other != host:
                        rule = ["OUTPUT", "-t", "nat", "-p", "tcp", "-s", host, "-d", other,
                                "--dport", str(port), "-m", "mark", "!", "--mark", str(MARK),
                                "-j", "REDIRECT", "--to-ports", str(self.port)]
                        sh("iptables", "-A", *rule)
                        self.rules.append(rule)
        except BaseException:
            self.close()
            raise

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the link proxy ended")
        return line.strip()

    def set(self, delay: float, jitter: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{delay} {jitter}\n")
        self.proc.stdin.flush()
        if self._line() != "ok":
            raise RuntimeError("the link proxy refused the setting")

    def close(self) -> None:
        for rule in self.rules:
            subprocess.run(["iptables", "-D", *rule], capture_output=True, timeout=20)
        self.rules.clear()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def serve(mark: int, seed: int, stdin: IO[str], stdout: IO[str]) -> None:
    proxy = DelayProxy(seed=seed, mark=mark)
    print(proxy.port, file=stdout, flush=True)
    for line in stdin:                     # ends when the parent closes the pipe or exits
        delay, jitter = (float(x) for x in line.split())
        proxy.set(delay, jitter)
        print("ok", file=stdout, flush=True)
    proxy.close()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(int(sys.argv[2]), int(sys.argv[3]), sys.stdin, sys.stdout)
