#!/usr/bin/env python3
"""Flood a node with EnqueueStreams and watch its memory: back-pressure or not.

Starts one DOQ node on loopback with gRPC (or uses --target with --pid), opens --streams
EnqueueStreams (grpc.aio client, one process) and, for --seconds, writes requests on each as
fast as gRPC's flow control lets it (never waiting for answers), while reading the answers.
Every second it samples the node's resident memory (VmRSS). At the end the writers half-close
and every answer is read.

Prints one JSON line: messages sent and answered, answers out of order (per stream, contents
must come back in the order sent: must be 0), messages missing (sent, never answered: must
be 0), msg/s, the node's RSS at 5 s, at the end and at most (MiB), and the messages sent
but not yet answered (in the network and in the node: bounded only with back-pressure).
Bounded by --seconds plus a drain limit; loopback only.

  python scripts/bench/grpc_flood.py --streams 64 --seconds 30
  python scripts/bench/grpc_flood.py --flag=--raft.pipeline_entries=4
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

from http_bench import free_ports  # noqa: E402


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def start_node(flags: list[str]) -> tuple[subprocess.Popen[bytes], str, str]:
    data = tempfile.mkdtemp(prefix="doq-flood-")
    http, raft = free_ports(2)
    args = [sys.executable, os.path.join(REPO, "doq.py"), "serve", "--cluster.node_id=node-0",
            f"--http.port={http}", "--http.host=127.0.0.1", f"--raft.address=127.0.0.1:{raft}",
            f"--cluster.peers=127.0.0.1:{raft}", f"--storage.data_dir={data}",
            "--grpc.address=127.0.0.1:0", *flags]
    log = open(os.path.join(data, "node.log"), "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=log, cwd=data)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/internal/status",
                                        timeout=2) as r:
                status = json.load(r)
            if status.get("grpc_addr") and status["raft"]["state"] == "leader":
                return proc, status["grpc_addr"], data
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the node did not start")


async def flood(target: str, pid: int, streams: int, seconds: float, size: int) -> dict[str, Any]:
    import grpc

    from doq_lib.pb import doq_pb2 as pb
    from doq_lib.pb import doq_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(target)
    stub = pb_grpc.DOQStub(channel)
    await stub.CreateQueue(pb.CreateQueueRequest(name="flood", type="delayed",
                                                 settings=pb.QueueSettings()))
    body = "x" * max(0, size - 12)
    sent = [0] * streams
    answered = [0] * streams
    out_of_order = [0]
    stop = asyncio.Event()

    async def one(k: int) -> None:
        call = stub.EnqueueStream()

        async def write() -> None:
            while not stop.is_set():
                await call.write(pb.EnqueueRequest(queueName="flood",
                                                   content=f"{sent[k]:010d}{body}"))
                sent[k] += 1
            await call.done_writing()

        writer = asyncio.create_task(write())
        async for response in call:
            if int(response.content[:10]) != answered[k]:
                out_of_order[0] += 1
            answered[k] += 1
        await writer

    samples: list[tuple[float, float]] = []
    unanswered: list[int] = []                 # sent but not answered yet, all streams
    started = time.monotonic()
    tasks = [asyncio.create_task(one(k)) for k in range(streams)]
    while time.monotonic() - started < seconds:
        await asyncio.sleep(1)
        samples.append((time.monotonic() - started, rss_mib(pid)))
        unanswered.append(sum(sent) - sum(answered))
    stop.set()
    flooded = time.monotonic() - started
    done, pending = await asyncio.wait(tasks, timeout=120)
    for task in pending:
        task.cancel()
    errors = [repr(t.exception()) for t in done if t.exception() is not None]
    await channel.close()
    at5 = next((m for t, m in samples if t >= 5), samples[0][1] if samples else 0.0)
    return {"streams": streams, "seconds": round(flooded, 1), "sent": sum(sent),
            "answered": sum(answered), "missing": sum(sent) - sum(answered),
            "out_of_order": out_of_order[0], "msgs_s": round(sum(answered) / flooded, 1),
            "rss_mib_at_5s": round(at5, 1), "rss_mib_end": round(samples[-1][1], 1),
            "rss_mib_max": round(max(m for _, m in samples), 1),
            "unanswered_at_5s": unanswered[min(4, len(unanswered) - 1)],
            "unanswered_end": unanswered[-1], "unanswered_max": max(unanswered),
            "errors": errors[:3], "unfinished_streams": len(pending)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--flag", action="append", default=[], help="extra node flag")
    a = ap.parse_args()
    if not 1 <= a.streams <= 512 or not 1 <= a.seconds <= 300:
        raise SystemExit("--streams 1-512, --seconds 1-300")
    proc, target, data = start_node(a.flag)
    try:
        result = asyncio.run(flood(target, proc.pid, a.streams, a.seconds, a.size))
        result["flags"] = a.flag
        print(json.dumps(result))
        return 0 if result["missing"] == 0 and result["out_of_order"] == 0 else 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
