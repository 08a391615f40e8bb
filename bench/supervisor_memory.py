"""Issue 20: a pod supervisor's memory across lost sessions (GOAWAYs, restarts, refusals).

    python bench/supervisor_memory.py [--mode goaway|abort|refuse] [--attempts 200] [--env K=V ...]

A real `python -m warmshell supervisor` process connects over TCP loopback to a stand-in
gateway (a grpc.aio server in this process) that activates it at once and then ends every
ConnectSupervisor session it opens:

- `goaway`: the session gets one heartbeat, then the server is stopped (GOAWAY, the connection
  closes) and a new one is started on the same port, as when a replica is killed and replaced;
- `abort`: the session gets one heartbeat, then the handler aborts it with UNAVAILABLE;
- `refuse`: the handler aborts at once with UNAVAILABLE (no heartbeat: the supervisor backs off,
  so this mode is slow — use few attempts).

The supervisor's RSS and anonymous memory (`/proc/<pid>/smaps_rollup`) are read after
`attempts/2` and after `attempts` sessions: growth per attempt over the second half is the
figure (the first half includes one-time warm-up). `--env MALLOC_ARENA_MAX=1` etc. run the
supervisor under a different allocator setting, to tell fragmentation from a leak.
Results go to `bench/results/supervisor_memory.json` and `.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc

RESULTS = Path(__file__).parent / "results"


def memory_of(pid: int) -> dict[str, int]:
    """RSS and anonymous/private-dirty KiB of `pid`."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss", "Private_Dirty", "Anonymous"):
            out[key] = int(rest.split()[0])
    return out


class StandIn(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Activates every registration; ends every session as `mode` says."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sessions = 0
        self.session_started = asyncio.Event()
        self.heartbeat_answered = asyncio.Event()

    async def RegisterSupervisor(self, request: Any, context: Any) -> AsyncIterator[spb.SupervisorActivationMessage]:
        yield spb.SupervisorActivationMessage(
            sandbox_id="sb-1",
            sandbox_name="memory",
            token="t" * 300,
            token_expires_at_ms=int(time.time() * 1000) + 3_600_000,
        )

    async def ConnectSupervisor(self, request_iterator: Any, context: Any) -> AsyncIterator[spb.GatewayMessage]:
        self.sessions += 1
        self.session_started.set()
        if self.mode == "refuse":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "refused")
        yield spb.GatewayMessage(heartbeat=spb.Heartbeat(sent_at_ms=1))
        async for message in request_iterator:
            if message.WhichOneof("message") == "heartbeat":
                break
        if self.mode == "abort":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "replica going away")
        self.heartbeat_answered.set()
        await asyncio.Event().wait()  # goaway: the server is stopped under this call

    async def RefreshSandboxToken(self, request: Any, context: Any) -> spb.RefreshSandboxTokenResponse:
        return spb.RefreshSandboxTokenResponse(token="t" * 300, expires_at_ms=int(time.time() * 1000) + 3_600_000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def start_server(servicer: StandIn, port: int, max_age_ms: int = 0) -> grpc.aio.Server:
    options = (
        [("grpc.max_connection_age_ms", max_age_ms), ("grpc.max_connection_age_grace_ms", 10)] if max_age_ms else []
    )
    server = grpc.aio.server(options=options)
    supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def run(
    mode: str, seconds: float, max_age_ms: int, extra_env: dict[str, str], python: str, src: str | None
) -> dict[str, Any]:
    """One supervisor against the stand-in for `seconds`; its memory at the half and at the end."""
    servicer = StandIn(mode)
    port = free_port()
    server = await start_server(servicer, port, max_age_ms)
    with tempfile.TemporaryDirectory(prefix="ws-supmem-") as tmp:
        token = Path(tmp) / "token"
        token.write_text("credential\n")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "WARMSHELL_GATEWAY": f"127.0.0.1:{port}",
            "WARMSHELL_BOOTSTRAP_FILE": str(token),
            "WARMSHELL_RESTART_POLICY": "OnFailure",
            **({"PYTHONPATH": src} if src else {}),
            **extra_env,
        }
        process = subprocess.Popen(
            [python, "-m", "warmshell", "supervisor"], env=env, stderr=subprocess.DEVNULL, cwd=tmp
        )
        samples: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(60):
                await servicer.session_started.wait()  # started and registered: the clock starts
            started = time.monotonic()
            samples.append({"sessions": servicer.sessions, **memory_of(process.pid)})
            for deadline in (seconds / 2, seconds):
                while time.monotonic() - started < deadline:
                    if mode == "goaway":
                        waited = servicer.heartbeat_answered
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(max(0.0, deadline - (time.monotonic() - started))):
                                await waited.wait()
                        if waited.is_set():
                            waited.clear()
                            await server.stop(None)
                            server = await start_server(servicer, port, max_age_ms)
                    else:
                        await asyncio.sleep(min(0.2, max(0.0, deadline - (time.monotonic() - started))))
                samples.append({"sessions": servicer.sessions, **memory_of(process.pid)})
            assert process.poll() is None, f"the supervisor exited with {process.returncode}"
        finally:
            process.kill()
            process.wait()
            await server.stop(None)
    first, half, end = samples
    return {
        "mode": mode,
        "tree": src or "this",
        "max_age_ms": max_age_ms,
        "env": extra_env,
        "seconds": seconds,
        "sessions": [first["sessions"], half["sessions"], end["sessions"]],
        "rss_kib": [first["Rss"], half["Rss"], end["Rss"]],
        "second_half_growth_kib": end["Private_Dirty"] - half["Private_Dirty"],
        "loadavg": Path("/proc/loadavg").read_text().split()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("goaway", "abort", "refuse"), default="abort")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-age-ms", type=int, default=1, help="the server GOAWAYs every connection after this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before-src", help="a source tree (its src/) to alternate with this one")
    parser.add_argument("--env", action="append", default=[], help="K=V for the supervisor's environment")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    trees: list[str | None] = [None, *([args.before_src] if args.before_src else [])]
    results = []
    for _ in range(args.rounds):
        for tree in trees:
            result = asyncio.run(run(args.mode, args.seconds, args.max_age_ms, extra, args.python, tree))
            print(json.dumps(result), flush=True)
            results.append(result)
    command = "python bench/supervisor_memory.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "supervisor_memory.json").write_text(json.dumps({"command": command, "runs": results}, indent=2))
    lines = [
        f"`{command}` (machine shared with other work; load average per run)",
        "",
        "| tree | sessions (start/half/end) | RSS MiB (start/half/end) | 2nd-half growth MiB | load |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        rss = "/".join(f"{kib / 1024:.0f}" for kib in r["rss_kib"])
        sessions = "/".join(str(n) for n in r["sessions"])
        growth = r["second_half_growth_kib"] / 1024
        lines.append(f"| {r['tree']} | {sessions} | {rss} | {growth:.1f} | {r['loadavg']} |")
    (RESULTS / "supervisor_memory.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
