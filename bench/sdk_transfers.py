"""Issue 33 part of `sdk.py`: the byte path of one transfer and a bulk upload, through
`warmshell.AsyncClient` against a gateway process (local driver).

Figures, per round, p50 over the rounds:
- one 5 MiB write from memory and one 5 MiB read, over the gateway's byte stream (what the SDK
  does from 1 MiB when the gateway offers it) and over gRPC's messages (the same client with the
  stream off), in alternating order round by round: wall time -> MB/s, and the CPU per transfer
  of the gateway process (every thread's, from schedstat: what a loaded machine distorts least)
  and of this client process;
- a 13-file repository (12 small files in three directories and one 5 MiB blob): `upload_dir` in
  one call, the same files as 13 `upload` calls (what a harness did before), and the blob alone
  (`upload`), with the ratio bulk / blob (the issue's target: at most 2).

With `--before-src DIR` (an older tree's `src/`) a second gateway runs that tree and the rounds
alternate between the two (the bulk upload is skipped where the older tree has no UploadTar), so
the before/after ratio is taken in one run, under the same load.

The floor beside them: a bare grpc.aio server in its own process whose client-streaming method
only counts the bytes of the same 256 KiB WriteFileRequest messages (no gateway, no file): what
grpcio itself costs per 5 MiB on this host, in the same rounds.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from harness import gateway_process

import warmshell
from warmshell.sdk.files import AsyncFiles

BLOB = 5 * 1024 * 1024


def _cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, every thread's, from schedstat (nanoseconds: /proc's stat
    counts in 10 ms ticks, as long as a whole transfer)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as handle:
                total += int(handle.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def make_repo(root: Path) -> Path:
    """Thirteen files: twelve small ones in three directories and one 5 MiB blob."""
    for i in range(12):
        path = root / "repo" / f"pkg{i % 3}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {i}\n" * 40)
    (root / "repo" / "blob.bin").write_bytes(os.urandom(BLOB))
    return root / "repo"


class _Timed:
    """Wall milliseconds, the gateway's CPU milliseconds and this client's of one awaited call."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    async def __call__(self, call: Any) -> tuple[float, float, float]:
        cpu, own, start = _cpu_seconds(self.pid), _cpu_seconds(os.getpid()), time.perf_counter()
        await call
        wall = (time.perf_counter() - start) * 1000
        return wall, (_cpu_seconds(self.pid) - cpu) * 1000, (_cpu_seconds(os.getpid()) - own) * 1000


def _grpc_only(sb: warmshell.AsyncSandbox) -> AsyncFiles:
    """The sandbox's files as the SDK reaches them without the byte stream (no gateway address)."""
    channel = sb.client._channel
    assert channel is not None  # open once the sandbox was created
    return AsyncFiles(channel, sb.name, sb.workspace, metadata=sb.client._metadata)


async def _one_round(
    sb: warmshell.AsyncSandbox, timed: _Timed, repo: Path, data: bytes, bulk: bool, stream_first: bool
) -> dict[str, Any]:
    files = sb.files
    out: dict[str, Any] = {}
    paths = [("", files), (" grpc", _grpc_only(sb))]
    for suffix, via in paths if stream_first else reversed(paths):
        out["write" + suffix] = await timed(via.write("/workspace/one.bin", data))
        out["read" + suffix] = await timed(via.read("/workspace/one.bin"))
    out["blob"] = await timed(files.upload(repo / "blob.bin", "/workspace/alone/blob.bin"))

    async def per_file() -> None:
        for path in sorted(p for p in repo.rglob("*") if p.is_file()):
            await files.upload(path, f"/workspace/calls/{path.relative_to(repo).as_posix()}")

    out["per_file"] = await timed(per_file())
    if bulk:
        out["bulk"] = await timed(files.upload_dir(repo, "/workspace/bulk"))
    return out


async def _tree(src: Path | None, stack: Any) -> tuple[warmshell.AsyncSandbox, _Timed, bool]:
    gw = await stack.enter_async_context(gateway_process(src=src))
    client = await stack.enter_async_context(warmshell.AsyncClient(state_dir=gw.state))
    sb = await client.create(name="transfers")
    await sb.files.write("/workspace/warm", b"x")
    try:
        await sb.files.upload_tar(iter([b"\0" * 1024]), "/workspace/probe")
        bulk = True
    except warmshell.ApiError:  # an older gateway: UploadTar is not implemented there
        bulk = False
    return sb, _Timed(gw.process.pid), bulk


async def _floor_server(path: str, *, max_receive: int = 1024 * 1024) -> None:
    from warmshell.api.v1 import sandbox_pb2 as pb

    async def count(requests: Any, _context: Any) -> Any:
        total = 0
        async for message in requests:
            total += len(message.data)
        return pb.WriteFileResponse(bytes_written=total)

    handler = grpc.stream_unary_rpc_method_handler(
        count,
        request_deserializer=pb.WriteFileRequest.FromString,
        response_serializer=pb.WriteFileResponse.SerializeToString,
    )
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_receive)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("floor.Floor", {"Count": handler})])
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    await server.wait_for_termination()


class _Floor:
    """The bare grpc.aio server (a child process) and a timed 5 MiB send to it."""

    def __init__(self, stack: Any, tmp: Path) -> None:
        import subprocess
        import sys

        self.path = tmp / "floor.sock"
        self.process = subprocess.Popen([sys.executable, __file__, "--floor-server", str(self.path)])
        stack.callback(self.process.kill)
        self.channel = grpc.aio.insecure_channel(f"unix://{self.path}")
        self.timed = _Timed(self.process.pid)

    async def send(self, data: bytes) -> None:
        from warmshell.api.v1 import sandbox_pb2 as pb

        call = self.channel.stream_unary(
            "/floor.Floor/Count",
            request_serializer=pb.WriteFileRequest.SerializeToString,
            response_deserializer=pb.WriteFileResponse.FromString,
        )()
        view = memoryview(data)
        for start in range(0, len(data), 256 * 1024):
            await call.write(pb.WriteFileRequest(data=bytes(view[start : start + 256 * 1024])))
        await call.done_writing()
        await call


def _p50s(samples: list[tuple[float, float, float]]) -> dict[str, float]:
    return {
        "wall_ms_p50": statistics.median(s[0] for s in samples),
        "gateway_cpu_ms_p50": statistics.median(s[1] for s in samples),
        "client_cpu_ms_p50": statistics.median(s[2] for s in samples),
        "n": len(samples),
    }


async def measure_transfers(rounds: int, before_src: Path | None) -> dict[str, Any]:
    """See the module docstring; {"after": {...}, "before": {...}?}."""
    from contextlib import AsyncExitStack

    data = os.urandom(BLOB)
    with tempfile.TemporaryDirectory(prefix="ws-transfers-") as tmp:
        repo = make_repo(Path(tmp))
        async with AsyncExitStack() as stack:
            trees = {"after": await _tree(None, stack)}
            if before_src is not None:
                trees["before"] = await _tree(before_src, stack)
            samples: dict[str, dict[str, list[tuple[float, float, float]]]] = {name: {} for name in trees}
            floor = _Floor(stack, Path(tmp))
            await asyncio.sleep(1.5)  # the floor server's start
            samples["grpc floor"] = {"write": []}
            for i in range(rounds):
                samples["grpc floor"]["write"].append(await floor.timed(floor.send(data)))
                order = list(trees) if i % 2 == 0 else list(reversed(trees))
                for name in order:
                    sb, timed, bulk = trees[name]
                    for key, value in (await _one_round(sb, timed, repo, data, bulk, i % 2 == 0)).items():
                        samples[name].setdefault(key, []).append(value)
    result: dict[str, Any] = {}
    for name, by_key in samples.items():
        figures = {key: _p50s(values) for key, values in by_key.items()}
        for key in ("write", "read", "write grpc", "read grpc"):
            if key not in figures:
                continue
            figures[key]["mb_per_s"] = BLOB / 1e6 / (figures[key]["wall_ms_p50"] / 1000)
            for side in ("gateway", "client"):
                figures[key][f"{side}_cpu_ms_per_mib"] = figures[key][f"{side}_cpu_ms_p50"] / (BLOB / 2**20)
        if "bulk" in figures:
            figures["bulk_over_blob"] = figures["bulk"]["wall_ms_p50"] / figures["blob"]["wall_ms_p50"]
        result[name] = figures
    return result


def transfers_table(result: dict[str, Any]) -> str:
    """The markdown table of `measure_transfers`."""
    table = (
        "\n| transfer (5 MiB; repo: 13 files, one 5 MiB) | tree | wall p50 ms | MB/s | gateway CPU p50 ms "
        "| client CPU p50 ms |\n|---|---|---|---|---|---|\n"
    )
    labels = {
        "write": "one write from memory (byte stream)",
        "write grpc": "one write from memory (gRPC messages)",
        "read": "one read into memory (byte stream)",
        "read grpc": "one read into memory (gRPC messages)",
        "blob": "the blob alone (upload)",
        "per_file": "the repo, 13 upload calls",
        "bulk": "the repo, upload_dir (one call)",
    }
    for key, label in labels.items():
        for tree in ("grpc floor", "before", "after"):
            figures = result.get(tree, {}).get(key)
            if figures is None:
                continue
            rate = f"{figures['mb_per_s']:.0f}" if "mb_per_s" in figures else ""
            client = f"{figures['client_cpu_ms_p50']:.1f}" if "client_cpu_ms_p50" in figures else ""
            table += (
                f"| {label} | {tree} | {figures['wall_ms_p50']:.1f} | {rate} | {figures['gateway_cpu_ms_p50']:.1f} "
                f"| {client} |\n"
            )
    after = result["after"]
    for key in ("write", "read") if "write grpc" in after else ():
        stream, grpc_path = after[key], after[f"{key} grpc"]
        table += (
            f"\nOne {key}, byte stream / gRPC messages (same run, alternating): rate "
            f"**{stream['mb_per_s'] / grpc_path['mb_per_s']:.2f}x**; CPU per MiB, gateway "
            f"{stream['gateway_cpu_ms_per_mib']:.2f} vs {grpc_path['gateway_cpu_ms_per_mib']:.2f} ms, client "
            f"{stream['client_cpu_ms_per_mib']:.2f} vs {grpc_path['client_cpu_ms_per_mib']:.2f} ms."
        )
    table += "\n"
    table += f"\nBulk upload / the blob alone (target ≤ 2): **{after['bulk_over_blob']:.2f}**"
    table += f"; 13 calls / one call: {after['per_file']['wall_ms_p50'] / after['bulk']['wall_ms_p50']:.2f}.\n"
    if "before" in result:
        before = result["before"]
        for key in ("write", "read"):
            rate = after[key]["mb_per_s"] / before[key]["mb_per_s"]
            cpu = after[key]["gateway_cpu_ms_p50"] / before[key]["gateway_cpu_ms_p50"]
            table += f"One {key}: after / before rate {rate:.2f}x, gateway CPU per transfer {cpu:.2f}x.\n"
    return table


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--before-src", type=Path)
    parser.add_argument("--floor-server", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        asyncio.run(_floor_server(args.floor_server))
        raise SystemExit(0)
    measured = asyncio.run(measure_transfers(args.rounds, args.before_src))
    print(json.dumps(measured, indent=2))
    print(transfers_table(measured))
