"""What one grpc.aio call costs the server in CPU on this host: a bare unary call, a
server-streaming call of one message, and one message more on an open bidirectional stream,
each served by a grpc.aio server in a process of its own (its CPU read from /proc around the
calls, all its threads), the client in this process over a Unix socket:

    python bench/investigations/kubernetes-gateway-calls/grpc_call_cpu.py [--calls 2000] [--interceptor]

`--interceptor`: the server has one pass-through interceptor, as the gateway's servers have (its
`listening.StopGate`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from warmshell.api.v1 import supervisor_pb2 as spb

SERVER = r"""
import asyncio, sys, grpc
from warmshell.api.v1 import supervisor_pb2 as spb

async def unary(request, context):
    return spb.RefreshSandboxTokenResponse(token="t")

async def one(request, context):
    yield spb.RefreshSandboxTokenResponse(token="t")

async def echo(requests, context):
    async for message in requests:
        yield spb.GatewayMessage(heartbeat=message.heartbeat)

class PassThrough(grpc.aio.ServerInterceptor):
    # As the gateway's StopGate while open: the method's own handler.

    async def intercept_service(self, continuation, details):
        return await continuation(details)

async def main():
    server = grpc.aio.server(interceptors=[PassThrough()] if sys.argv[2] == "interceptor" else [])
    request, reply = spb.RefreshSandboxTokenRequest.FromString, spb.RefreshSandboxTokenResponse.SerializeToString
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, request, reply),
        "Stream": grpc.unary_stream_rpc_method_handler(one, request, reply),
        "Echo": grpc.stream_stream_rpc_method_handler(
            echo, spb.SupervisorMessage.FromString, spb.GatewayMessage.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b.B", handlers),))
    server.add_insecure_port("unix://" + sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(path: str, pid: int, calls: int) -> dict[str, list[float]]:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        unary = channel.unary_unary(
            "/b.B/Unary", spb.RefreshSandboxTokenRequest.SerializeToString, spb.RefreshSandboxTokenResponse.FromString
        )
        stream = channel.unary_stream(
            "/b.B/Stream", spb.RefreshSandboxTokenRequest.SerializeToString, spb.RefreshSandboxTokenResponse.FromString
        )
        echo = channel.stream_stream(
            "/b.B/Echo", spb.SupervisorMessage.SerializeToString, spb.GatewayMessage.FromString
        )
        request = spb.RefreshSandboxTokenRequest()
        for _ in range(100):  # warm-up
            await unary(request)
        figures: dict[str, list[float]] = {}

        async def timed(name: str, work) -> None:
            before = cpu_seconds(pid)
            await work()
            figures.setdefault(name, []).append((cpu_seconds(pid) - before) / calls * 1000)

        async def unaries() -> None:
            for _ in range(calls):
                await unary(request)

        async def streams() -> None:
            for _ in range(calls):
                async for _reply in stream(request):
                    pass

        async def messages() -> None:
            call = echo()
            message = spb.SupervisorMessage(heartbeat=spb.Heartbeat(sent_at_ms=1))
            for _ in range(calls):
                await call.write(message)
                await call.read()
            await call.done_writing()

        for _round in range(2):  # interleaved, on a shared host
            await timed("a unary call", unaries)
            await timed("a server-streaming call of one message", streams)
            await timed("one message each way on an open stream", messages)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--interceptor", action="store_true", help="a pass-through interceptor on the server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/s.sock"
        kind = "interceptor" if args.interceptor else "none"
        server = subprocess.Popen([sys.executable, "-c", SERVER, path, kind], stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == b"ready"
            started = time.perf_counter()
            figures = asyncio.run(measure(path, server.pid, args.calls))
        finally:
            server.terminate()
            server.wait()
    took = time.perf_counter() - started
    with_ = "one pass-through interceptor" if args.interceptor else "no interceptor"
    print(f"server CPU per call with {with_}, ms ({args.calls} each, load {os.getloadavg()[0]:.1f}, {took:.0f} s):")
    for name, rounds in figures.items():
        print(f"  {name}: " + ", ".join(f"{ms:.3f}" for ms in rounds))


if __name__ == "__main__":
    main()
