#!/usr/bin/env python3
"""HTTP benchmark of a local 3-node DOQ cluster (fsync-majority durability on).

Starts three nodes on loopback (or uses --urls), then runs, --repeat times on a fresh queue:

  produce  --messages distinct random 256-byte payloads, --producers concurrent producers;
           every send waits for its 200 (committed on a majority, fsynced). msgs/s.
  consume  drain those messages with --consumers concurrent consumers: GET ?ack=false, then
           POST .../ack for each message (separate ack). msgs/s.
  latency  one client, one enqueue at a time: p50 / p99 over --latency-samples requests.

Prints one JSON line per repetition and a summary (medians) as a Markdown table row.
Every loop is bounded by a message count and --max-seconds; only loopback is used.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALPHABET = string.ascii_letters + string.digits


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Security:
    """What --secret, --keys and --tls turn on for a local cluster, and what the client
    then needs: the node flags, the Authorization header and the TLS context."""

    def __init__(self, directory: str, secret: bool, keys: bool, tls: bool) -> None:
        sys.path.insert(0, REPO)
        self.flags: list[str] = []
        self.headers: dict[str, str] = {}
        self.ssl: Any = None
        self.scheme = "https" if tls else "http"
        if secret:
            self.flags.append("--raft.password=bench cluster secret of 32 chars")
        if keys:
            from doq_lib import auth
            key = auth.new_key()
            path = os.path.join(directory, "keys.yaml")
            auth.write_keys_file(path, [auth.ApiKey("bench", "admin", auth.hash_key(key))])
            self.flags.append(f"--auth.keys_file={path}")
            self.headers = {"Authorization": f"Bearer {key}"}
        if tls:
            import ssl

            from doq_lib.certs import make_certificates
            certs = os.path.join(directory, "certs")
            make_certificates(certs, {"node": []})
            node, key_file = os.path.join(certs, "node.pem"), os.path.join(certs, "node-key.pem")
            self.flags += [f"--http.tls_cert={node}", f"--http.tls_key={key_file}",
                           f"--cluster.tls_ca={os.path.join(certs, 'ca.pem')}"]
            self.ssl = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))


class LocalCluster:
    def __init__(self, size: int, flags: list[str], secret: bool = False, keys: bool = False,
                 tls: bool = False) -> None:
        self.dir = tempfile.mkdtemp(prefix="doq-bench-")
        self.security = Security(self.dir, secret, keys, tls)
        flags = flags + self.security.flags
        ports = free_ports(2 * size)
        self.http_ports, raft = ports[:size], ports[size:]
        peers = ",".join(f"127.0.0.1:{p}" for p in raft)
        self.procs = []
        for i in range(size):
            args = [sys.executable, os.path.join(REPO, "doq.py"), "serve",
                    f"--cluster.node_id=node-{i}", f"--http.port={self.http_ports[i]}",
                    "--http.host=127.0.0.1", f"--raft.address=127.0.0.1:{raft[i]}",
                    f"--cluster.peers={peers}", f"--storage.data_dir={self.dir}", *flags]
            log = open(os.path.join(self.dir, f"node-{i}.log"), "wb")
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=log, cwd=self.dir))

    @property
    def urls(self) -> list[str]:
        return [f"{self.security.scheme}://127.0.0.1:{p}" for p in self.http_ports]

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def payload(rng: random.Random, size: int) -> str:
    return "".join(rng.choices(ALPHABET, k=size))


class Bench:
    def __init__(self, args: argparse.Namespace, urls: list[str],
                 security: Security | None = None) -> None:
        self.a = args
        self.urls = urls
        self.security = security
        self.queue = f"bench-{os.getpid()}"
        self.session: Any = None
        self.target_url = urls[0]

    async def open(self) -> None:
        import aiohttp
        security = self.security
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60,
                                           ssl=security.ssl if security else None),
            timeout=aiohttp.ClientTimeout(total=30),
            headers=security.headers if security else None)

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                codes = []
                for url in self.urls:
                    async with self.session.get(f"{url}/readyz") as r:
                        codes.append(r.status)
                if all(c == 200 for c in codes):
                    return
            except OSError:
                pass
            await asyncio.sleep(0.2)
        raise SystemExit("cluster not ready within 60 s")

    async def find_leader(self) -> str:
        for url in self.urls:
            async with self.session.get(f"{url}/internal/status") as r:
                if (await r.json())["raft"]["state"] == "leader":
                    return url
        raise SystemExit("no leader found")

    def node_for(self, worker: int) -> str:
        if self.a.target == "all":
            return self.urls[worker % len(self.urls)]
        return self.target_url

    async def reset(self, rep: int) -> None:
        self.queue = f"bench-{os.getpid()}-{rep}"
        async with self.session.post(f"{self.urls[0]}/API/v1/queues",
                                     json={"name": self.queue, "type": "delayed"}) as r:
            if r.status != 200:
                raise SystemExit(f"create queue: HTTP {r.status} {await r.text()}")

    async def produce(self, payloads: list[str]) -> float:
        it = iter(payloads)
        deadline = time.monotonic() + self.a.max_seconds

        async def batch_worker(w: int) -> int:
            url = f"{self.node_for(w)}/API/v1/queues/{self.queue}/messages/batch"
            sent = 0
            while time.monotonic() <= deadline:
                chunk = [c for _, c in zip(range(self.a.batch), it)]
                if not chunk:
                    break
                body = {"messages": [{"content": c, "priority": 10} for c in chunk]}
                async with self.session.post(url, json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"enqueue batch: HTTP {r.status}")
                sent += len(chunk)
            return sent

        async def worker(w: int) -> int:
            if self.a.batch:
                return await batch_worker(w)
            url = f"{self.node_for(w)}/API/v1/queues/{self.queue}/messages"
            sent = 0
            for content in it:
                async with self.session.post(url, json={"content": content,
                                                        "priority": 10}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"enqueue: HTTP {r.status}")
                sent += 1
                if time.monotonic() > deadline:
                    break
            return sent

        start = time.perf_counter()
        sent = sum(await asyncio.gather(*(worker(w) for w in range(self.a.producers))))
        return sent / (time.perf_counter() - start)

    async def consume(self, expected: int) -> float:
        remaining = [expected]
        deadline = time.monotonic() + self.a.max_seconds

        async def worker(w: int) -> int:
            base = f"{self.node_for(w)}/API/v1/queues/{self.queue}/messages"
            got = 0
            while remaining[0] > 0 and time.monotonic() < deadline:
                async with self.session.get(base + "?ack=false") as r:
                    body = await r.read()
                    if r.status != 200:
                        await asyncio.sleep(0.001)
                        continue
                remaining[0] -= 1
                mid = json.loads(body)["id"]
                async with self.session.post(f"{base}/{mid}/ack") as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"ack: HTTP {r.status}")
                got += 1
            return got

        start = time.perf_counter()
        got = sum(await asyncio.gather(*(worker(w) for w in range(self.a.consumers))))
        return got / (time.perf_counter() - start)

    async def latency(self, rng: random.Random) -> tuple[float, float]:
        url = f"{self.node_for(0)}/API/v1/queues/{self.queue}/messages"
        samples = []
        for _ in range(self.a.latency_samples):
            body = {"content": payload(rng, self.a.size), "priority": 10}
            start = time.perf_counter()
            async with self.session.post(url, json=body) as r:
                await r.read()
            samples.append(time.perf_counter() - start)
        samples.sort()
        return (samples[len(samples) // 2] * 1e3, samples[int(len(samples) * 0.99)] * 1e3)

    async def run(self) -> list[dict[str, Any]]:
        await self.open()
        await self.wait_ready()
        self.target_url = await self.find_leader() if self.a.target == "leader" else self.urls[0]
        results = []
        rng = random.Random(self.a.seed)
        for rep in range(self.a.repeat):
            await self.reset(rep)
            payloads = [payload(rng, self.a.size) for _ in range(self.a.messages)]
            produce = await self.produce(payloads)
            consume = await self.consume(len(payloads))
            p50, p99 = await self.latency(rng)
            row = {"rep": rep, "produce_msgs_s": round(produce), "consume_ack_msgs_s":
                   round(consume), "enqueue_p50_ms": round(p50, 2), "enqueue_p99_ms": round(p99, 2)}
            print(json.dumps(row), flush=True)
            results.append(row)
        await self.session.close()
        return results


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys = ["produce_msgs_s", "consume_ack_msgs_s", "enqueue_p50_ms", "enqueue_p99_ms"]
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urls", help="comma-separated node URLs (default: start a local cluster)")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--target", choices=["all", "first", "leader"], default="all",
                    help="spread clients over every node, or send everything to the first "
                         "URL or to the leader (latency always uses one node)")
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--producers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=0,
                    help="produce through POST .../messages/batch, this many per request "
                         "(0: one message per request)")
    ap.add_argument("--consumers", type=int, default=32)
    ap.add_argument("--latency-samples", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--flag", action="append", default=[],
                    help="extra node flag, e.g. --flag=--raft.max_inflight=8")
    ap.add_argument("--secret", action="store_true",
                    help="local cluster with a cluster secret (Raft authenticated, encrypted)")
    ap.add_argument("--keys", action="store_true",
                    help="local cluster with a keys file; the client sends an admin key")
    ap.add_argument("--tls", action="store_true",
                    help="local cluster serving HTTPS (a throwaway CA from doq certs)")
    args = ap.parse_args()
    cluster = None
    security = None
    if args.urls:
        urls = [u.strip().rstrip("/") for u in args.urls.split(",")]
        if any(not u.startswith(("http://127.", "http://localhost")) for u in urls):
            raise SystemExit("only loopback URLs are allowed")
    else:
        cluster = LocalCluster(args.nodes, args.flag, args.secret, args.keys, args.tls)
        urls, security = cluster.urls, cluster.security
    try:
        import uvloop  # the client is on the same cores:
        uvloop.install()                                # keep its share small
    except ImportError:
        pass
    try:
        rows = asyncio.run(Bench(args, urls, security).run())
    finally:
        if cluster is not None:
            cluster.stop()
    med = summarize(rows)
    print(json.dumps({"median": med, "repeat": args.repeat, "target": args.target,
                      "secret": args.secret, "keys": args.keys, "tls": args.tls}))
    print(f"| {med['produce_msgs_s']:,.0f} | {med['consume_ack_msgs_s']:,.0f} | "
          f"{med['enqueue_p50_ms']:.2f} / {med['enqueue_p99_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
