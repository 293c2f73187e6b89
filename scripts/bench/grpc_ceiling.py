#!/usr/bin/env python3
"""How fast can a Python gRPC server answer EnqueueStream at all, with no queue behind it?

Starts a do-nothing ``queue.DOQ`` server (EnqueueStream answers each request at once with a
made-up id; CreateQueue / GetQueue / DeleteQueue succeed) in one of three serving models, then
drives it with the ``stream`` workload of ``grpc_bench.py`` (same client, same framing: 8
streams, a window of 128 requests each). The figure is the ceiling of the serving model on
this machine: a real node does Raft, fsync and the state machine on top.

  gevent   monkey-patched process, ``grpc.experimental.gevent.init_gevent()`` (how a node
           serves gRPC today)
  threads  plain process, grpcio's own OS threads (``grpc.server`` with a thread pool)
  asyncio  plain process, ``grpc.aio`` server

  python scripts/bench/grpc_ceiling.py --repeat 3 --messages 20000

Prints one JSON line per run (msg/s and the server's CPU in % of one core) and a Markdown
table of the medians. Loopback only; every run is bounded by grpc_bench.py's --max-seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODES = ["gevent", "threads", "asyncio"]


# -- the do-nothing server --------------------------------------------------------------------

def serve(mode: str, port: int) -> None:
    if mode == "gevent":
        from gevent import monkey
        monkey.patch_all()
    sys.path.insert(0, REPO)
    import grpc

    if mode == "gevent":
        import grpc.experimental.gevent
        grpc.experimental.gevent.init_gevent()
    from doq_lib.pb import doq_pb2 as pb
    from doq_lib.pb import doq_pb2_grpc as pb_grpc

    address = f"127.0.0.1:{port}"
    counter = [0]

    def answer(r: pb.EnqueueRequest) -> pb.EnqueueResponse:
        counter[0] += 1
        return pb.EnqueueResponse(success=True, id=counter[0], queueName=r.queueName,
                                  content=r.content, priority=r.priority, group=r.group)

    if mode == "asyncio":
        import asyncio

        class AsyncNoop(pb_grpc.DOQServicer):
            async def CreateQueue(self, request, context):  # type: ignore[no-untyped-def]
                return pb.CreateQueueResponse(success=True)

            async def DeleteQueue(self, request, context):  # type: ignore[no-untyped-def]
                return pb.DeleteQueueResponse(success=True)

            async def GetQueue(self, request, context):  # type: ignore[no-untyped-def]
                return pb.GetQueueResponse(name=request.name, type="delayed")

            async def EnqueueStream(self, requests, context):  # type: ignore[no-untyped-def]
                async for r in requests:
                    yield answer(r)

        async def main() -> None:
            server = grpc.aio.server()
            pb_grpc.add_DOQServicer_to_server(AsyncNoop(), server)
            server.add_insecure_port(address)
            await server.start()
            print("ready", flush=True)
            await server.wait_for_termination()

        asyncio.run(main())
        return

    from concurrent import futures

    class Noop(pb_grpc.DOQServicer):
        def CreateQueue(self, request, context):  # type: ignore[no-untyped-def]
            return pb.CreateQueueResponse(success=True)

        def DeleteQueue(self, request, context):  # type: ignore[no-untyped-def]
            return pb.DeleteQueueResponse(success=True)

        def GetQueue(self, request, context):  # type: ignore[no-untyped-def]
            return pb.GetQueueResponse(name=request.name, type="delayed")

        def EnqueueStream(self, requests, context):  # type: ignore[no-untyped-def]
            for r in requests:
                yield answer(r)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    pb_grpc.add_DOQServicer_to_server(Noop(), server)
    server.add_insecure_port(address)
    server.start()
    print("ready", flush=True)
    if mode == "gevent":
        import gevent
        while True:
            gevent.sleep(1)
    server.wait_for_termination()


# -- the driver ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(mode: str, args: argparse.Namespace) -> dict[str, object]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", mode, "--port", str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit(f"{mode} server did not start")
        before, t0 = cpu_seconds(server.pid), time.perf_counter()
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "grpc_bench.py"), "--targets",
             f"127.0.0.1:{port}", "--workloads", "stream", "--repeat", "1",
             "--messages", str(args.messages), "--max-seconds", str(args.max_seconds)],
            capture_output=True, text=True, timeout=args.max_seconds + 120)
        seconds = time.perf_counter() - t0
        server_cpu = 100 * (cpu_seconds(server.pid) - before) / seconds
        row = next(json.loads(line) for line in out.stdout.splitlines()
                   if line.startswith('{"rep"'))
        return {"mode": mode, "msgs_s": row["msgs_s"], "errors": row.get("errors", 0),
                "out_of_order": row.get("out_of_order", 0),
                "client_cpu_pct": row.get("client_cpu_pct"),
                "server_cpu_pct_incl_setup": round(server_cpu, 1)}
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    modes = [m for m in args.modes.split(",") if m]
    results: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for mode in modes:                       # alternate, so drift hits every mode alike
            row = run(mode, args)
            print(json.dumps(row), flush=True)
            results[mode].append(float(row["msgs_s"]))  # type: ignore[arg-type]
    print("\n| serving model | EnqueueStream msg/s, median (runs) |\n|---|---|")
    for mode, rates in results.items():
        runs = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"| {mode} | {statistics.median(rates):,.0f} ({runs}) |")


if __name__ == "__main__":
    main()
