"""Where the proxied client's extra CPU per MiB is: the download client of `bench/egress.py`,
reporting its own user and system time (getrusage), its receive calls and its context switches,
from the host directly and from inside a sandbox through the proxy, 256 MiB on 1 and 16 streams,
4 alternating pairs (medians of the last 3).

    python bench/investigations/egress-streams/client_cpu.py
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from egress import UPSTREAM
from harness import GatewayProcess, gateway_process
from warm_path import wait_idle

from warmshell.api.v1 import sandbox_pb2 as pb

CLIENT = """
import json, resource, socket, sys, threading, urllib.request
authority, amount, streams = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
calls = [0]
read_into = socket.SocketIO.readinto
def counted(self, buffer):
    calls[0] += 1
    return read_into(self, buffer)
socket.SocketIO.readinto = counted
def fetch():
    with urllib.request.urlopen(f"http://{authority}/bytes/{amount}") as answer:
        while answer.read(1 << 20):
            pass
before = resource.getrusage(resource.RUSAGE_SELF)
threads = [threading.Thread(target=fetch) for _ in range(streams)]
for thread in threads: thread.start()
for thread in threads: thread.join()
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime,
    "recvs": calls[0], "involuntary": after.ru_nivcsw - before.ru_nivcsw}))
"""


async def _inside(gw: GatewayProcess, *args: str) -> dict[str, Any]:
    out = b""
    request = pb.ExecSandboxRequest(name="bench", command=["python3", "-c", CLIENT, *args])
    async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
        out += event.stdout
    return dict(json.loads(out))


async def main() -> None:
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM], stdout=subprocess.PIPE, text=True)
    assert upstream.stdout is not None
    authority = f"127.0.0.2:{upstream.stdout.readline().strip()}"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pools = Path(tmp) / "pools"
            pools.mkdir()
            (pools / "egress.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 1\nimage = ""\n')
            config = Path(tmp) / "gateway.toml"
            config.write_text("[network]\nrequests_may_widen = true\nmax_bytes_per_second = 10000000000\n")
            async with gateway_process("--pools", str(pools), "--config", str(config)) as gw:
                await wait_idle(gw, "egress", 1, timeout=300)
                resources = pb.Resources(cpu=str(os.cpu_count()))
                spec = pb.SandboxSpec(network=pb.NetworkPolicy(allow=[authority]), resources=resources)
                await gw.create_ready(name="bench", spec=spec)
                for streams in (1, 16):
                    args = (authority, str((256 << 20) // streams), str(streams))
                    rows: dict[str, list[dict[str, Any]]] = {"direct": [], "proxied": []}
                    for _ in range(4):
                        done = subprocess.run([sys.executable, "-c", CLIENT, *args], capture_output=True, env=env)
                        rows["direct"].append(json.loads(done.stdout))
                        rows["proxied"].append(await _inside(gw, *args))
                    for path, runs in rows.items():
                        median = {key: statistics.median(run[key] for run in runs[1:]) for key in runs[0]}
                        print(
                            f"{streams:2d} streams {path:7s}: user {median['user'] * 1000 / 256:.3f} sys "
                            f"{median['sys'] * 1000 / 256:.3f} ms/MiB, {median['recvs'] / 256:.1f} receives/MiB, "
                            f"{median['involuntary']:.0f} involuntary switches"
                        )
    finally:
        upstream.terminate()
        upstream.wait()
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
