"""Whole-process latency of the `warmshell` command against a local gateway (issue 18).

Each round runs every command once, as a script or an agent shelling out would: a new process
of the installed `warmshell` console script, wall time from spawn to exit. `python -c pass` (the
same interpreter, same site-packages) is measured in the same rounds as the baseline, so a loaded
machine shows up in both. Targets: `sandbox list`, `sandbox get` and `sandbox exec -- true` each
at most 100 ms, `warmshell --help` at most 80 ms.

The CLI talks to a local gateway over the SDK's light HTTP/2 transport; the `grpcio:` rows run
the same commands with WARMSHELL_TRANSPORT=grpcio (the grpcio client) in the same rounds, and the
two `floor` rows time the imports alone of each path.

    python bench/cli_latency.py [--rounds 40] [--before-src DIR]

`--before-src DIR` also times the same commands with the `warmshell` package found under DIR
(e.g. an exported `src/` of an older commit), in the same rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import gateway_process, summary, write_results

TARGETS_MS = {"sandbox list": 100.0, "sandbox get": 100.0, "sandbox exec -- true": 100.0, "--help": 80.0}


_ARGV = {
    "--help": ["--help"],
    "--version": ["--version"],
    "sandbox list": ["sandbox", "list"],
    "sandbox get": ["sandbox", "get", "bench"],
    "sandbox exec -- true": ["sandbox", "exec", "bench", "--", "true"],
    "pool list": ["pool", "list"],
}


# What the CLI imports for `sandbox list` on the HTTP/2 transport (the floor under its commands).
_CLI_IMPORTS = "import warmshell.cli.main, warmshell.cli.client, warmshell.cli.render, warmshell.sdk.client"
_GRPCIO = {"WARMSHELL_TRANSPORT": "grpcio"}
_COMPARED = ("sandbox list", "sandbox get", "sandbox exec -- true")

Command = tuple[list[str], dict[str, str]]  # argv, extra environment


def _commands(warmshell: str, before_src: Path | None) -> dict[str, Command]:
    commands: dict[str, Command] = {
        "python -c pass (baseline)": ([sys.executable, "-c", "pass"], {}),
        # What any grpcio client in Python pays before its first call.
        "import grpc.aio + stubs (floor)": (
            [sys.executable, "-c", "import grpc.aio, warmshell.api.v1.sandbox_pb2_grpc"],
            {},
        ),
        "import the CLI's modules (floor)": ([sys.executable, "-c", _CLI_IMPORTS], {}),
    }
    commands |= {label: ([warmshell, *argv], {}) for label, argv in _ARGV.items()}
    commands |= {f"grpcio: {label}": ([warmshell, *_ARGV[label]], _GRPCIO) for label in _COMPARED}
    if before_src is not None:
        # What the console script does, with the older package first on sys.path.
        run_old = f"import sys; sys.path.insert(0, {str(before_src)!r}); from warmshell.cli.main import main; main()"
        commands |= {
            f"before: {label}": ([sys.executable, "-c", run_old, *argv], {})
            for label, argv in _ARGV.items()
            if label != "--version"
        }
    return commands


def _time_once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
    return elapsed


async def measure(rounds: int, before_src: Path | None) -> dict[str, object]:
    warmshell = shutil.which("warmshell", path=str(Path(sys.executable).parent)) or shutil.which("warmshell")
    if warmshell is None:
        raise SystemExit("the `warmshell` console script is not installed next to this python")
    async with gateway_process() as gateway:
        await gateway.create(name="bench")
        await gateway.wait_ready("bench")
        # PYTHONDONTWRITEBYTECODE (set in some shells and CI images) would recompile every module
        # on every call; an installed CLI has its .pyc files, so measure it that way.
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSHELL_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["WARMSHELL_STATE_DIR"] = str(gateway.state)
        commands = _commands(warmshell, before_src)
        samples: dict[str, list[float]] = {label: [] for label in commands}
        for argv, extra in commands.values():  # one unmeasured run each: page cache, .pyc files
            await asyncio.to_thread(_time_once, argv, env | extra)
        load_before = os.getloadavg()
        for _ in range(rounds):
            # Interleaved, so a burst of load from elsewhere hits every command alike.
            for label, (argv, extra) in commands.items():
                samples[label].append(await asyncio.to_thread(_time_once, argv, env | extra))
    return {
        "rounds": rounds,
        "load_average_before": load_before,
        "wall_ms": {label: summary(values) for label, values in samples.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--before-src", type=Path, help="also time the warmshell package under this directory")
    args = parser.parse_args()
    data = asyncio.run(measure(args.rounds, args.before_src))
    wall: dict[str, dict[str, float]] = data["wall_ms"]  # type: ignore[assignment]
    base = wall["python -c pass (baseline)"]["p50"]
    data["p50_over_baseline"] = {label: s["p50"] / base for label, s in wall.items()}
    data["targets_ms"] = TARGETS_MS
    data["targets_met_p50"] = {label: wall[label]["p50"] <= limit for label, limit in TARGETS_MS.items()}
    over_grpcio = {label: wall[label]["p50"] / wall[f"grpcio: {label}"]["p50"] for label in _COMPARED}
    data["http2_over_grpcio_p50"] = over_grpcio
    data["load_average_after"] = os.getloadavg()
    table = "| command | n | p50 ms | p90 ms | min ms | p50 / baseline | target |\n|---|---|---|---|---|---|---|\n"
    for label, s in wall.items():
        target = f"<= {TARGETS_MS[label]:.0f} ms" if label in TARGETS_MS else ""
        ratio = s["p50"] / base
        table += (
            f"| `{label}` | {s['n']} | {s['p50']:.1f} | {s['p90']:.1f} | {s['min']:.1f} | {ratio:.2f}x | {target} |\n"
        )
    table += (
        "\nWall time of a whole `warmshell` process (spawn to exit) against a local gateway, interleaved "
        "rounds, the baseline in the same rounds; `grpcio:` rows are the same commands on the grpcio "
        "transport (WARMSHELL_TRANSPORT=grpcio). HTTP/2 transport p50 / grpcio p50: "
        + ", ".join(f"{label} {ratio:.2f}x" for label, ratio in over_grpcio.items())
        + ". 1-minute load average "
        f"{data['load_average_before'][0]:.2f} before the measured rounds, "  # type: ignore[index]
        f"{data['load_average_after'][0]:.2f} after (2 cores): "  # type: ignore[index]
        "where it is high, read the ratios, not the absolute figures.\n"
    )
    write_results("cli_latency", data, table)


if __name__ == "__main__":
    main()
