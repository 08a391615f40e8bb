"""Issues 13 and 36 soak: well-behaved clients create, exec in and delete sandboxes over and over,
quiet and beside hostile sandboxes, in one gateway and one invocation. The run alternates in
blocks (quiet, then with the attacks), so a shared machine's bursts fall on both alike:

- disk fill: fills its bounded /workspace (ENOSPC), holds it a moment, frees it; again and again;
- fork bomb: each process forks two and waits, until its process bound (a request for 64) stops it;
- output flood: 64 MiB per exec, read by a client that pauses every chunk (flow control, no loss);
- memory balloon: writes 256 MiB under a 64Mi memory limit (the OOM killer ends it in its sandbox);
- inode flood: 300,000 empty files in /tmp under a 64Mi limit (their kernel memory is charged to
  the sandbox, so the limit stops it).

The attacks run twice per block: with no cpu limit on the hostile sandboxes, and with each under
`--hostile-cpu` (100m: the five together half a core), so one run shows what the cgroup's cpu
bound gives the well-behaved clients. The hostile sandboxes are made at the start of each attack
block and deleted at its end, after their usage (GetSandbox) is read. Reports the well-behaved
clients' create -> Ready (warm and cold), exec and delete latency p50/p99 quiet and with the
attacks, how often each attack hit its bound, the attackers' peak memory, and lost outputs: every
exec's output (the flood's too) is checked against its SHA-256. The load average is sampled
throughout.

    python bench/soak.py                                  # 1.5 min quiet + 2 x 1.5 min with the attacks, in 3 blocks
    python bench/soak.py --quiet-minutes 0.5 --minutes 1 --blocks 1  # a smoke run

Run as root: the process bound needs a uid per sandbox, the memory limits a cgroup.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from harness import GatewayProcess, gateway_process, summary, write_results

from warmshell.api.v1 import sandbox_pb2 as pb

WORKSPACE_SIZE = "256Mi"
CONFIG = f'[local]\nworkspace_size = "{WORKSPACE_SIZE}"\n'
POOL = 'version = 1\nworkspace = "default"\nreplicas = 4\n'
BOMB_PIDS = 64
FLOOD_BYTES = 64 * 2**20
MEMORY_LIMIT = "64Mi"
BALLOON_MIB = 256
FLOOD_FILES = 300_000
SIGKILLED = (-9, 128 + 9)  # how an exec may report a SIGKILL (the OOM killer's)


@dataclass(frozen=True)
class Hostile:
    """One attack: its script, the process bound and memory limit its sandbox asks for, and
    whether an exec of it (exit code, stderr) was stopped by its bound."""

    script: str
    bound_hit: Callable[[int, bytes], bool]
    pids: int = 0
    memory: str = ""


HOSTILE = {
    "disk-fill": Hostile(
        "dd if=/dev/zero of=/workspace/fill bs=1M 2>&1 | grep -m1 'No space' >&2; sleep 2; rm -f /workspace/fill",
        lambda _, err: b"No space left on device" in err,  # dd's words
    ),
    # Each process forks two, waits, and lingers a moment: the sandbox sits at its bound.
    "fork-bomb": Hostile("b() { b & b & wait; sleep 1; }; b", lambda _, err: b"Cannot fork" in err, pids=BOMB_PIDS),
    "output-flood": Hostile(f"yes flood | head -c {FLOOD_BYTES}", lambda code, _: code == 0),
    # Every page written: four times its limit, so the OOM killer ends it inside its sandbox.
    "memory-balloon": Hostile(
        f"python3 -c \"b = b'x' * ({BALLOON_MIB} << 20); print(len(b))\"",
        lambda code, _: code in SIGKILLED,
        memory=MEMORY_LIMIT,
    ),
    # Empty files take no tmpfs blocks but ~1 KiB of kernel memory each, charged to the sandbox:
    # its memory limit stops the flood. The last run's files go first (that frees their memory).
    "inode-flood": Hostile(
        "find /tmp -maxdepth 1 -name 'f*' -delete; "
        f"python3 -c \"[open(f'/tmp/f{{i}}', 'w').close() for i in range({FLOOD_FILES})]\"",
        lambda code, _: code in SIGKILLED,
        memory=MEMORY_LIMIT,
    ),
}


def pattern(word: str, size: int) -> bytes:
    """What `yes WORD | head -c SIZE` writes."""
    line = (word + "\n").encode()
    return (line * (size // len(line) + 1))[:size]


@dataclass
class Phase:
    """What one phase measured."""

    create_ms: dict[str, list[float]] = field(default_factory=lambda: {"warm": [], "cold": []})
    exec_ms: list[float] = field(default_factory=list)
    delete_ms: list[float] = field(default_factory=list)
    execs: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)
    load: list[float] = field(default_factory=list)


async def exec_digest(
    gw: GatewayProcess, name: str, script: str, *, workspace: str = "", timeout: int = 0, pause: float = 0.0
) -> tuple[int, str, int, bytes]:
    """Run a script; its exit code, the SHA-256 and length of its stdout, and its stderr."""
    digest, size, err, code = hashlib.sha256(), 0, bytearray(), -1
    command = ["/bin/sh", "-c", script]
    request = pb.ExecSandboxRequest(name=name, workspace=workspace, command=command, timeout_seconds=timeout)
    async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
        kind = event.WhichOneof("event")
        if kind == "stdout":
            digest.update(event.stdout)
            size += len(event.stdout)
            if pause:
                await asyncio.sleep(pause)
        elif kind == "stderr":
            err += event.stderr[: max(0, 65536 - len(err))]
        elif kind == "exit_code":
            code = event.exit_code
    return code, digest.hexdigest(), size, bytes(err)


async def well_behaved(gw: GatewayProcess, worker: int, until: float, phase: Phase, tag: str) -> None:
    rounds = 0
    rng = random.Random(f"{tag}{worker}")  # not the `secrets` module: bench/secrets.py shadows it here
    while time.monotonic() < until:
        name = f"{tag}-w{worker}-{rounds}"
        rounds += 1
        try:
            start = time.perf_counter()
            await gw.create(name=name)
            ready = await gw.wait_ready(name)
            allocation = "warm" if ready.status.allocation == "warm" else "cold"
            phase.create_ms[allocation].append((time.perf_counter() - start) * 1000)
            for _ in range(3):
                word, size = f"{rng.getrandbits(48):012x}", rng.randrange(1024, 1 << 20)
                start = time.perf_counter()
                code, digest, got, _ = await exec_digest(gw, name, f"yes {word} | head -c {size}")
                phase.exec_ms.append((time.perf_counter() - start) * 1000)
                phase.execs += 1
                if (code, digest, got) != (0, hashlib.sha256(pattern(word, size)).hexdigest(), size):
                    phase.lost += 1
                    phase.errors.append(f"{name}: exit {code}, {got} of {size} bytes")
            start = time.perf_counter()
            await gw.delete(name)
            phase.delete_ms.append((time.perf_counter() - start) * 1000)
        except grpc.aio.AioRpcError as exc:
            phase.errors.append(f"{name}: {exc.code().name}: {exc.details()}")
            with contextlib.suppress(grpc.aio.AioRpcError):
                await gw.delete(name)


@dataclass
class Attack:
    runs: int = 0
    bound_hits: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)
    peak_memory_bytes: list[int] = field(default_factory=list)  # per block, from GetSandbox
    exit_codes: collections.Counter[int] = field(default_factory=collections.Counter)


async def hostile(gw: GatewayProcess, kind: str, name: str, attack: Attack) -> None:
    """Keep the attack going (again each time its exec ends) until cancelled."""
    attacker = HOSTILE[kind]
    expected = hashlib.sha256(pattern("flood", FLOOD_BYTES)).hexdigest()
    while True:
        try:
            if kind == "output-flood":
                # A slow reader: a pause per chunk, so the command is held back by flow control.
                code, digest, size, err = await exec_digest(gw, name, attacker.script, workspace="hostile", pause=0.002)
                attack.lost += (code, digest, size) != (0, expected, FLOOD_BYTES)
            else:
                code, _, _, err = await exec_digest(gw, name, attacker.script, workspace="hostile", timeout=30)
            attack.bound_hits += attacker.bound_hit(code, err)
            attack.exit_codes[code] += 1
            attack.runs += 1
        except grpc.aio.AioRpcError as exc:
            attack.errors.append(f"{exc.code().name}: {exc.details()}")
            await asyncio.sleep(0.5)


async def sample_load(phase: Phase) -> None:
    while True:
        phase.load.append(os.getloadavg()[0])
        await asyncio.sleep(10)


async def run_phase(gw: GatewayProcess, seconds: float, workers: int, tag: str, phase: Phase) -> None:
    """The well-behaved clients for `seconds`, adding to `phase`."""
    sampler = asyncio.create_task(sample_load(phase))
    until = time.monotonic() + seconds
    try:
        await asyncio.gather(*(well_behaved(gw, w, until, phase, tag) for w in range(workers)))
    finally:
        sampler.cancel()


@dataclass
class Attacked:
    """One way of running the attacks (with no cpu limit on the hostile sandboxes, or with one),
    what the well-behaved clients measured beside them, and what each attack did."""

    cpu: str
    phase: Phase = field(default_factory=Phase)
    attacks: dict[str, Attack] = field(default_factory=lambda: {kind: Attack() for kind in HOSTILE})

    @property
    def label(self) -> str:
        return f"each hostile sandbox at cpu {self.cpu}" if self.cpu else "no cpu limit on the hostile sandboxes"


async def with_attacks(gw: GatewayProcess, tag: str, attacked: Attacked, body: Awaitable[None]) -> None:
    """`body` while the hostile sandboxes of this block attack; they are deleted afterwards."""
    names = {kind: f"{kind}-{tag}" for kind in HOSTILE}
    for kind, attacker in HOSTILE.items():
        resources = pb.Resources(pids=attacker.pids, memory=attacker.memory, cpu=attacked.cpu)
        await gw.create(name=names[kind], workspace="hostile", spec=pb.SandboxSpec(resources=resources))
    for name in names.values():
        await wait_ready_in(gw, name, "hostile")
    attacks = attacked.attacks
    tasks = [asyncio.create_task(hostile(gw, kind, name, attacks[kind])) for kind, name in names.items()]
    await asyncio.sleep(3)  # let the attacks reach their bounds
    try:
        await body
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for kind, name in names.items():
            ref = pb.SandboxRef(name=name, workspace="hostile")
            with contextlib.suppress(grpc.aio.AioRpcError):
                usage = (await gw.stub.GetSandbox(ref, metadata=gw.metadata)).status.usage
                if usage.HasField("memory_peak_bytes"):
                    attacks[kind].peak_memory_bytes.append(usage.memory_peak_bytes)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await gw.stub.DeleteSandbox(ref, metadata=gw.metadata)


async def wait_ready_in(gw: GatewayProcess, name: str, workspace: str) -> None:
    request = pb.WatchSandboxRequest(name=name, workspace=workspace, stop_on_ready=True, stop_on_terminal=True)
    async for _ in gw.stub.WatchSandbox(request, metadata=gw.metadata):
        pass


def latency_rows(quiet: Phase, loud: Phase) -> list[str]:
    rows = [
        "| well-behaved clients | quiet n | quiet p50 ms | quiet p99 ms | hostile n | hostile p50 ms "
        "| hostile p99 ms | p50 ratio | p99 ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    series = [
        ("create → Ready, warm", quiet.create_ms["warm"], loud.create_ms["warm"]),
        ("create → Ready, cold", quiet.create_ms["cold"], loud.create_ms["cold"]),
        ("exec (≤ 1 MiB output, checked)", quiet.exec_ms, loud.exec_ms),
        ("delete", quiet.delete_ms, loud.delete_ms),
    ]
    for label, q_values, h_values in series:
        if not q_values or not h_values:
            rows.append(f"| {label} | {len(q_values)} | - | - | {len(h_values)} | - | - | - | - |")
            continue
        q, h = summary(q_values), summary(h_values)
        rows.append(
            f"| {label} | {q['n']} | {q['p50']:.1f} | {q['p99']:.1f} | {h['n']} | {h['p50']:.1f} | {h['p99']:.1f} "
            f"| {h['p50'] / q['p50']:.2f} | {h['p99'] / q['p99']:.2f} |"
        )
    return rows


def attack_rows(attacks: dict[str, Attack]) -> list[str]:
    rows = [
        "| attack | runs | hit its bound | lost outputs | errors | peak memory MiB (per block) | exit codes (runs) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, attack in attacks.items():
        peaks = ", ".join(f"{peak / 2**20:.0f}" for peak in attack.peak_memory_bytes) or "-"
        codes = ", ".join(f"{code} ({runs})" for code, runs in attack.exit_codes.most_common())
        rows.append(
            f"| {name} | {attack.runs} | {attack.bound_hits} | {attack.lost} | {len(attack.errors)} | {peaks} "
            f"| {codes} |"
        )
    return rows


def table(data: dict[str, object], quiet: Phase, variants: list[Attacked]) -> str:
    rows: list[str] = []
    for variant in variants:
        loud = variant.phase
        rows += [f"## With the attacks, {variant.label}", "", *latency_rows(quiet, loud), ""]
        rows += [*attack_rows(variant.attacks), ""]
        rows.append(
            f"Lost outputs (well-behaved): {quiet.lost} of {quiet.execs} execs quiet, {loud.lost} of {loud.execs} "
            f"with the attacks; errors: {len(quiet.errors)} quiet, {len(loud.errors)} with the attacks. "
            f"Load average (1 min) {_mean(loud.load):.2f} (max {max(loud.load):.2f})."
        )
        rows.append("")
    rows += [
        f"{data['workers']} well-behaved clients; {data['quiet_seconds']:g} s quiet and {data['hostile_seconds']:g} s "
        f"beside {', '.join(HOSTILE)} (split evenly between the ways of running them), in {data['blocks']} "
        f"alternating blocks (/workspace {WORKSPACE_SIZE}, fork bomb at {BOMB_PIDS} processes, "
        f"{FLOOD_BYTES >> 20} MiB per flood exec read with a pause per chunk, a {BALLOON_MIB} MiB balloon and "
        f"{FLOOD_FILES:,} empty files each under memory {MEMORY_LIMIT}).",
        f"Load average (1 min) quiet {_mean(quiet.load):.2f} (max {max(quiet.load):.2f}). The machine (2 cpus) "
        "was shared with other work throughout (other builds and test runs): the quiet and attack blocks "
        "alternate so it weighs on all of them alike, but absolute figures are not a quiet machine's.",
    ]
    return "\n".join(rows)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _phase_data(phase: Phase) -> dict[str, object]:
    return {
        "create_ready_ms": {k: summary(v) for k, v in phase.create_ms.items() if v},
        "exec_ms": summary(phase.exec_ms) if phase.exec_ms else {},
        "delete_ms": summary(phase.delete_ms) if phase.delete_ms else {},
        "execs": phase.execs,
        "lost_outputs": phase.lost,
        "errors": phase.errors[:20],
        "error_count": len(phase.errors),
        "load_average_1m": phase.load,
    }


async def main(quiet_seconds: float, hostile_seconds: float, workers: int, blocks: int, hostile_cpu: str) -> None:
    quiet = Phase()
    variants = [Attacked(cpu="")] + ([Attacked(cpu=hostile_cpu)] if hostile_cpu else [])
    each = hostile_seconds / blocks / len(variants)
    with tempfile.TemporaryDirectory(prefix="ws-soak-") as tmp:
        config, pools = Path(tmp) / "gateway.toml", Path(tmp) / "pools"
        config.write_text(CONFIG)
        pools.mkdir()
        (pools / "soak.toml").write_text(POOL)
        async with gateway_process("--config", str(config), "--pools", str(pools)) as gw:
            for block in range(blocks):
                await run_phase(gw, quiet_seconds / blocks, workers, f"q{block}", quiet)
                for v, variant in enumerate(variants):
                    tag = f"{block}v{v}"
                    await with_attacks(gw, tag, variant, run_phase(gw, each, workers, f"h{tag}", variant.phase))
    data: dict[str, object] = {
        "workers": workers,
        "quiet_seconds": quiet_seconds,
        "hostile_seconds": hostile_seconds,
        "blocks": blocks,
        "workspace_size": WORKSPACE_SIZE,
        "memory_limit": MEMORY_LIMIT,
        "quiet": _phase_data(quiet),
        "hostile": [
            {
                "hostile_cpu": variant.cpu,
                "well_behaved": _phase_data(variant.phase),
                "attacks": {n: {"runs": a.runs, "bound_hits": a.bound_hits, "lost": a.lost, "errors": a.errors[:10],
                                "peak_memory_bytes": a.peak_memory_bytes, "exit_codes": dict(a.exit_codes)}
                            for n, a in variant.attacks.items()},
            }
            for variant in variants
        ],
    }  # fmt: skip
    write_results("soak", data, table(data, quiet, variants))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet-minutes", type=float, default=1.5, help="time without the attacks, in all")
    parser.add_argument("--minutes", type=float, default=3.0, help="time with the attacks, in all")
    parser.add_argument("--blocks", type=int, default=3, help="alternations of a quiet and an attack block")
    parser.add_argument("--workers", type=int, default=3, help="well-behaved clients")
    parser.add_argument(
        "--hostile-cpu",
        default="100m",
        help="also run the attacks with each hostile sandbox under this cpu limit ('' = only without one)",
    )
    args = parser.parse_args()
    asyncio.run(main(args.quiet_minutes * 60, args.minutes * 60, args.workers, args.blocks, args.hostile_cpu))
