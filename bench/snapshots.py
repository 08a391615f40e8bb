"""Issue 31 benchmark: snapshots and forks of local sandboxes, in one run on one gateway (local
driver, run as root: images of the store need it).

- snapshot time against the amount written (0 to `--max-mb` MB into /workspace and the image's
  directories) over a ~5 MB image, and the same `--mid-mb` written over that image with a layer of
  `--big-mb` MB on top: linear in what changed, flat in the image's size;
- fork of 10 against one parent with an empty /workspace and with `--fork-mb` MB in it (target: the
  big one <= 1.5x the empty one), beside a single cold create of the same snapshot (target: fork(10)
  all Ready <= 3x the single create);
- warm create -> Ready from a pool of a snapshot vs from a pool of the plain image (target <= 1.1x);
- pause and resume wall time of a sandbox with an empty /workspace and with `--fork-mb` MB in it
  (a pause is a snapshot and a stop; a resume a cold create from the snapshot, Ready).

Rows are interleaved (one sample of each in turn) so a load drift over the run hits them alike.
Images no tag names (a fork's, a snapshot re-tagged) are pruned between samples, as an operator's
`image prune` would: on a VM whose memory the host backs on first touch, a store growing by
hundreds of MB per sample measures that first touch (~3 ms per MB here) rather than the copy.
The A/B part (`--ab-repeats` turns, 0 for none): fork(10) of both parents, a cold create of the
full parent's snapshot and one of the plain image, in turns, on a gateway of this tree and, with
`--baseline-src DIR` (another tree's `src/`, e.g. `git archive main src | tar -x -C DIR/..` with
its agent binaries built or copied in), one of that tree, both up at once, which goes first
alternating: each gateway's own CPU over the fork call (its threads' scheduler time, to the
nanosecond: the part of a fork a change to the gateway moves, without its sandboxes' processes
or the deletes), and each turn's ratios on one gateway. Those pairs, seconds apart, are the
fork ratios to report: the main part's rows run once each, minutes apart, under whatever load
the host had then.
Run as root from the repository root: `python bench/snapshots.py --repeats 5`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import GatewayProcess, gateway_process, summary, write_results

from warmshell.api.v1 import image_pb2, image_pb2_grpc
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests/helpers builds images
from tests.helpers import images
from tests.integration.drivers_local.test_image_sandboxes import tools_layer

SMALL, BIG = "bench/tools:1", "bench/tools-big:1"
# Published figures of hosted services, for the table's last column.
FIELD = {
    "pause": "E2B ~4 s per GB of memory",
    "resume": "E2B ~1 s",
    "fork": "Morph < 250 ms per branch, CodeSandbox ~0.5 s",
}


def import_images(state: Path, work: Path, big_mb: int) -> None:
    store = ImageStore(state / "images", max_bytes=64 << 30)
    store.open()
    base = tools_layer("bench").tar()
    # No Cmd: the sandboxes run nothing but their agent (a shell as Cmd would exit at once).
    idle = {"Env": ["PATH=/usr/bin:/bin"]}
    images.write_oci_layout(work / "small", [base], config=images.config_json([base], **idle))
    import_image(store, work / "small", name=SMALL)
    big = images.Layer()
    for n in range(big_mb):
        big.file(f"opt/big/f{n}", os.urandom(1 << 20))
    layers = [base, big.tar()]
    images.write_oci_layout(work / "big", layers, config=images.config_json(layers, **idle), compress=False)
    import_image(store, work / "big", name=BIG)


async def sh(gw: GatewayProcess, name: str, script: str) -> None:
    request = pb.ExecSandboxRequest(name=name, command=["/bin/sh", "-c", script])
    code = None
    async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
        if event.WhichOneof("event") == "exit_code":
            code = event.exit_code
    if code != 0:
        raise RuntimeError(f"{script!r} in {name} exited {code}")


def write_mb(megabytes: int) -> str:
    """Half into /workspace, half into the image's directories (the writable upper layer)."""
    half = megabytes * (1 << 20) // 2
    return (
        f"head -c {half} /dev/urandom > /workspace/w && mkdir -p /opt/out && head -c {half} /dev/urandom > /opt/out/o"
    )


async def snapshot(gw: GatewayProcess, name: str, image: str) -> tuple[float, pb.SnapshotSandboxResponse]:
    start = time.perf_counter()
    request = pb.SnapshotSandboxRequest(name=name, image=image, force=True)
    response = await gw.stub.SnapshotSandbox(request, metadata=gw.metadata)
    return (time.perf_counter() - start) * 1000, response


def cpu_ms(gw: GatewayProcess) -> float:
    """CPU milliseconds of the gateway and of its children it has reaped (the sandboxes it
    stopped): what a fork costs on a shared host, where its wall time says more of the load."""
    fields = Path(f"/proc/{gw.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) * 1000 / os.sysconf("SC_CLK_TCK")


def threads_cpu_ms(gw: GatewayProcess) -> float:
    """CPU milliseconds of the gateway's threads now (the scheduler's nanoseconds: finer than
    `cpu_ms`'s clock ticks, and without its sandboxes' processes)."""
    total = 0
    for task in Path(f"/proc/{gw.process.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


async def snapshot_rows(gw: GatewayProcess, written: list[int], mid_mb: int, repeats: int) -> dict[str, Any]:
    rows: dict[str, tuple[list[float], list[float], list[float]]] = {}
    cases = [(f"small_{mb}mb", SMALL, mb) for mb in written] + [(f"big_{mid_mb}mb", BIG, mid_mb)]
    for turn in range(repeats):
        for key, image, megabytes in cases:
            name = f"snap-{key.replace('_', '-')}-{turn}"
            await gw.create_ready(name=name, spec=pb.SandboxSpec(image=image))
            if megabytes:
                await sh(gw, name, write_mb(megabytes))
            before = cpu_ms(gw)
            wall, response = await snapshot(gw, name, f"bench/snap-{key.replace('_', '-')}:1")
            walls, frozen, cpus = rows.setdefault(key, ([], [], []))
            walls.append(wall)
            frozen.append(response.frozen_ms)
            cpus.append(cpu_ms(gw) - before)
            await gw.delete(name)
            await prune(gw)
    return {
        key: {"wall_ms": summary(w), "frozen_ms": summary(f), "cpu_ms": summary(c)} for key, (w, f, c) in rows.items()
    }


async def fork_all_ready(gw: GatewayProcess, parent: str, prefix: str, count: int) -> float:
    return (await fork_measured(gw, parent, prefix, count))[0]


async def fork_measured(gw: GatewayProcess, parent: str, prefix: str, count: int) -> tuple[float, float]:
    """fork(count) all Ready: its wall ms and the gateway's own CPU ms over the call (then the
    children are deleted and the fork's image pruned)."""
    before = threads_cpu_ms(gw)
    start = time.perf_counter()
    request = pb.ForkSandboxRequest(name=parent, count=count, prefix=prefix, ready_timeout_ms=120_000)
    response = await gw.stub.ForkSandbox(request, metadata=gw.metadata, timeout=300)
    wall = (time.perf_counter() - start) * 1000
    call_cpu = threads_cpu_ms(gw) - before
    bad = [c.name for c in response.children if c.error_code or c.sandbox.status.phase != pb.SANDBOX_PHASE_READY]
    if bad:
        raise RuntimeError(f"fork children not Ready: {bad}")
    for child in response.children:
        await gw.delete(child.name)
    await prune(gw)  # the fork's untagged image, now that its children are gone
    return wall, call_cpu


async def prune(gw: GatewayProcess) -> None:
    """Remove the images no tag names (see the module's doc)."""
    await image_pb2_grpc.ImageServiceStub(gw.channel).PruneImages(image_pb2.PruneImagesRequest(), metadata=gw.metadata)


async def fork_rows(gw: GatewayProcess, fork_mb: int, repeats: int) -> dict[str, Any]:
    """Wall times, and CPU (the gateway's and its reaped sandboxes', each sample with the deletes
    and the prune after it: a fork's children are only reaped once deleted)."""
    await fork_parents(gw, fork_mb)
    _, taken = await snapshot(gw, "parent-full", "bench/forked:1")
    samples: dict[str, tuple[list[float], list[float]]] = {}
    for turn in range(repeats):
        for key, parent in (("fork10_empty", "parent-empty"), (f"fork10_{fork_mb}mb", "parent-full")):
            before = cpu_ms(gw)
            wall = await fork_all_ready(gw, parent, f"{parent[7]}{turn}", 10)
            walls, cpus = samples.setdefault(key, ([], []))
            walls.append(wall)
            cpus.append(cpu_ms(gw) - before)
        before = cpu_ms(gw)
        start = time.perf_counter()
        await gw.create_ready(name=f"single-{turn}", spec=pb.SandboxSpec(image=f"sha256:{taken.digest[7:]}"))
        wall = (time.perf_counter() - start) * 1000
        await gw.delete(f"single-{turn}")
        walls, cpus = samples.setdefault("single_cold_create", ([], []))
        walls.append(wall)
        cpus.append(cpu_ms(gw) - before)
    return {key: {**summary(w), "cpu_ms": summary(c)} for key, (w, c) in samples.items()}


async def fork_parents(gw: GatewayProcess, fork_mb: int) -> None:
    """A gateway's two fork parents (an empty /workspace, `fork_mb` MB in it) on the small image."""
    await gw.create_ready(name="parent-empty", spec=pb.SandboxSpec(image=SMALL))
    await gw.create_ready(name="parent-full", spec=pb.SandboxSpec(image=SMALL))
    await sh(gw, "parent-full", f"head -c {fork_mb << 20} /dev/urandom > /workspace/big")


async def cold_create(gw: GatewayProcess, name: str, image: str) -> tuple[float, float]:
    """One cold create -> Ready of `image`: its wall ms, and the CPU ms of the gateway and of its
    sandbox once deleted (as `fork_rows` counts a fork's)."""
    before = cpu_ms(gw)
    start = time.perf_counter()
    await gw.create_ready(name=name, spec=pb.SandboxSpec(image=image))
    wall = (time.perf_counter() - start) * 1000
    await gw.delete(name)
    return wall, cpu_ms(gw) - before


async def fork_versus(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """fork(10) of both parents, and a cold create of the full parent's snapshot and of the plain
    image, `--ab-repeats` turns on a gateway of this tree and (with `--baseline-src`) one of that
    tree, both up at once and taking turns (which goes first alternates), so the host's load falls
    on both alike. Each turn's ratios are taken within the turn, on one gateway: samples a few
    seconds apart, under the same load."""
    sides = {**({"baseline": args.baseline_src} if args.baseline_src else {}), "this": None}
    samples: dict[str, dict[str, tuple[list[float], list[float], list[float]]]] = {side: {} for side in sides}
    full = f"fork10_{args.fork_mb}mb"
    images: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        pair: list[tuple[str, GatewayProcess]] = []
        for side, src in sides.items():
            gw = await stack.enter_async_context(gateway_process(src=src))
            pair.append((side, gw))
            (work / side).mkdir()
            await asyncio.to_thread(import_images, gw.state, work / side, 1)
            await fork_parents(gw, args.fork_mb)
            _, taken = await snapshot(gw, "parent-full", "bench/forked:1")
            images[side] = f"sha256:{taken.digest[7:]}"
        for turn in range(args.ab_repeats):
            for side, gw in pair if turn % 2 == 0 else pair[::-1]:
                rows = samples[side]
                for key, parent in (("fork10_empty", "parent-empty"), (full, "parent-full")):
                    before = cpu_ms(gw)
                    wall, call_cpu = await fork_measured(gw, parent, f"{parent[7]}{turn}", 10)
                    _append(rows, key, wall, cpu_ms(gw) - before, call_cpu)
                # The two cold creates take turns going first: the first sandbox start after a
                # pause waits ~10 ms for an RCU grace period at its cgroup v1 placement and the
                # next one, right behind it, does not (`investigations/image-cold-create`).
                creates = (("single_cold_create", images[side]), ("cold_create_plain", SMALL))
                for key, image in creates if turn % 2 == 0 else creates[::-1]:
                    wall, cpu = await cold_create(gw, f"{key.replace('_', '-')}-{turn}", image)
                    _append(rows, key, wall, cpu, float("nan"))
    return {
        side: {
            **{key: {**summary(w), "cpu_ms": summary(c), "call_cpu_ms": summary(g)} for key, (w, c, g) in rows.items()},
            "pair_ratios": pair_ratios(rows, full),
        }
        for side, rows in samples.items()
    }


def _append(rows: dict[str, tuple[list[float], list[float], list[float]]], key: str, *values: float) -> None:
    for column, value in zip(rows.setdefault(key, ([], [], [])), values, strict=True):
        column.append(value)


def pair_ratios(rows: dict[str, tuple[list[float], list[float], list[float]]], full: str) -> dict[str, Any]:
    """Each turn's ratios (wall, and CPU for the two forks), summarised: the figures a shared
    host's load drift moves least."""
    walls = {key: columns[0] for key, columns in rows.items()}
    cpus = {key: columns[1] for key, columns in rows.items()}

    def each(top: list[float], bottom: list[float]) -> dict[str, float]:
        return summary([a / b for a, b in zip(top, bottom, strict=True)])

    return {
        "fork_full_over_empty": each(walls[full], walls["fork10_empty"]),
        "fork_full_over_empty_cpu": each(cpus[full], cpus["fork10_empty"]),
        "fork10_empty_over_single_create": each(walls["fork10_empty"], walls["single_cold_create"]),
        "fork10_full_over_single_create": each(walls[full], walls["single_cold_create"]),
        "single_create_over_plain": each(walls["single_cold_create"], walls["cold_create_plain"]),
    }


async def pause_rows(gw: GatewayProcess, megabytes: int, repeats: int) -> dict[str, Any]:
    """Pause then resume (-> Ready) of one sandbox per size, `repeats` times each, alternating."""
    samples: dict[str, list[float]] = {}
    sizes = {"empty": 0, f"{megabytes}mb": megabytes}
    for key, size in sizes.items():
        await gw.create_ready(name=f"napper-{key}", spec=pb.SandboxSpec(image=SMALL))
        if size:
            await sh(gw, f"napper-{key}", f"head -c {size << 20} /dev/urandom > /workspace/big")
    for _ in range(repeats):
        for key in sizes:
            name = f"napper-{key}"
            start = time.perf_counter()
            await gw.stub.PauseSandbox(pb.PauseSandboxRequest(name=name), metadata=gw.metadata)
            middle = time.perf_counter()
            request = pb.ResumeSandboxRequest(name=name, wait_ready=True, ready_timeout_ms=60_000)
            resumed = await gw.stub.ResumeSandbox(request, metadata=gw.metadata)
            end = time.perf_counter()
            if resumed.status.phase != pb.SANDBOX_PHASE_READY:
                raise RuntimeError(f"{name} did not resume: {resumed.status}")
            samples.setdefault(f"pause_{key}", []).append((middle - start) * 1000)
            samples.setdefault(f"resume_{key}", []).append((end - middle) * 1000)
    for key in sizes:
        await gw.delete(f"napper-{key}")
    return {key: summary(values) for key, values in samples.items()}


async def warm_rows(gw: GatewayProcess, creates: int) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while True:
        listed = {p.name: p.idle for p in (await gw.pools()).pools}
        if listed.get("plain", 0) >= creates and listed.get("prepared", 0) >= creates:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"pools never filled: {listed}")
        await asyncio.sleep(0.2)
    samples: dict[str, tuple[list[float], set[str]]] = {"warm_plain": ([], set()), "warm_snapshot": ([], set())}
    pair = (("warm_plain", SMALL), ("warm_snapshot", "bench/prepared:1"))
    for turn in range(creates):
        # Each create starts its pool's refill, which the next create runs beside: the order
        # alternates (ABBA) so neither pool always goes second.
        for key, image in pair if turn % 2 == 0 else pair[::-1]:
            start = time.perf_counter()
            ready = await gw.create_ready(name=f"{key.replace('_', '-')}-{turn}", spec=pb.SandboxSpec(image=image))
            samples[key][0].append((time.perf_counter() - start) * 1000)
            samples[key][1].add(ready.status.allocation)
    return {key: {"client_ms": summary(v), "allocations": sorted(a)} for key, (v, a) in samples.items()}


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    pools = work / "pools"
    pools.mkdir()
    for name, image in (("plain", SMALL), ("prepared", "bench/prepared:1")):
        profile = f'version = 1\nworkspace = "default"\nreplicas = {args.creates}\nimage = "{image}"\n'
        (pools / f"{name}.toml").write_text(profile)
    async with gateway_process("--pools", str(pools)) as gw:
        await asyncio.to_thread(import_images, gw.state, work, args.big_mb)
        await gw.create_ready(name="prep", spec=pb.SandboxSpec(image=SMALL))
        await sh(gw, "prep", "echo deps > /workspace/installed && mkdir -p /opt/venv && echo x > /opt/venv/y")
        await snapshot(gw, "prep", "bench/prepared:1")
        written = [0, *(mb for mb in (10, 50, args.max_mb) if mb <= args.max_mb)]
        data: dict[str, Any] = {"snapshot": await snapshot_rows(gw, sorted(set(written)), args.mid_mb, args.repeats)}
        data["fork"] = await fork_rows(gw, args.fork_mb, args.repeats)
        data["pause"] = await pause_rows(gw, args.fork_mb, args.repeats)
        data["warm"] = await warm_rows(gw, args.creates)
    if args.ab_repeats:
        data["fork_versus_baseline"] = await fork_versus(args, work)
    data["load"] = os.getloadavg()[0]
    return data


def ratios(data: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    fork = data["fork"]
    snap = data["snapshot"]
    warm = data["warm"]
    versus = data.get("fork_versus_baseline")
    full = f"fork10_{args.fork_mb}mb"
    return {
        "fork_full_over_empty": fork[full]["p50"] / fork["fork10_empty"]["p50"],
        "fork_full_over_empty_cpu": fork[full]["cpu_ms"]["p50"] / fork["fork10_empty"]["cpu_ms"]["p50"],
        "fork10_over_single_create": fork[full]["p50"] / fork["single_cold_create"]["p50"],
        "fork10_empty_over_single_create": fork["fork10_empty"]["p50"] / fork["single_cold_create"]["p50"],
        "snapshot_big_image_over_small": snap[f"big_{args.mid_mb}mb"]["wall_ms"]["p50"]
        / snap[f"small_{args.mid_mb}mb"]["wall_ms"]["p50"],
        "warm_snapshot_over_plain": warm["warm_snapshot"]["client_ms"]["p50"] / warm["warm_plain"]["client_ms"]["p50"],
        # The A/B's: each turn's ratio on this tree's gateway, p50 (the figures to report).
        **{f"ab_{key}": row["p50"] for key, row in (versus or {}).get("this", {}).get("pair_ratios", {}).items()},
    }


def table(data: dict[str, Any], found: dict[str, float], args: argparse.Namespace) -> str:
    lines = [
        "## Snapshot time against what was written",
        "",
        "| case | wall p50 ms | frozen p50 ms | gateway CPU p50 ms |",
        "|---|---|---|---|",
    ]
    for key, row in data["snapshot"].items():
        wall, frozen, cpu = row["wall_ms"]["p50"], row["frozen_ms"]["p50"], row["cpu_ms"]["p50"]
        lines.append(f"| {key} | {wall:.1f} | {frozen:.1f} | {cpu:.0f} |")
    lines += [
        "",
        "## Fork of 10 (all Ready), and one cold create of the snapshot",
        "",
        "| case | p50 ms | p90 ms | CPU p50 ms (gateway and its sandboxes, with the deletes) |",
        "|---|---|---|---|",
    ]
    for key, row in data["fork"].items():
        lines.append(f"| {key} | {row['p50']:.1f} | {row['p90']:.1f} | {row['cpu_ms']['p50']:.0f} |")
    lines += ["", "## Pause, and resume -> Ready", "", "| case | p50 ms | p90 ms |", "|---|---|---|"]
    for key, row in data["pause"].items():
        lines.append(f"| {key} | {row['p50']:.1f} | {row['p90']:.1f} |")
    lines += ["", "## Warm create -> Ready", "", "| pool | p50 ms | p90 ms | served |", "|---|---|---|---|"]
    for key, row in data["warm"].items():
        client = row["client_ms"]
        lines.append(f"| {key} | {client['p50']:.1f} | {client['p90']:.1f} | {','.join(row['allocations'])} |")
    lines += versus_table(data.get("fork_versus_baseline"), args)
    flat, warm = found["snapshot_big_image_over_small"], found["warm_snapshot_over_plain"]
    lines += ["", "## Ratios", ""]
    lines += fork_ratio_lines(data, found, args)
    lines += [
        f"- snapshot of {args.mid_mb} MB written over a {args.big_mb} MB-bigger image: **{flat:.2f}x** (flat: 1x)",
        f"- warm create from a snapshot's pool over a plain image's pool: **{warm:.2f}x** (target <= 1.1x)",
        "",
        f"Beside the field: {FIELD['fork']}; pause {FIELD['pause']}; resume {FIELD['resume']}.",
        f"Load (1 min) at the end: {data['load']:.1f}.",
    ]
    return "\n".join(lines)


def fork_ratio_lines(data: dict[str, Any], found: dict[str, float], args: argparse.Namespace) -> list[str]:
    """The two fork targets: from the A/B's pairs (each turn's ratio on this tree's gateway, p50)
    when it ran, the main part's p50s beside them (one pass, under whatever load there was)."""
    main_full, main_single = found["fork_full_over_empty"], found["fork10_over_single_create"]
    main = (
        f"main part: {main_full:.2f}x, in CPU {found['fork_full_over_empty_cpu']:.2f}x",
        f"main part: {main_single:.2f}x of the {args.fork_mb} MB parent, "
        f"{found['fork10_empty_over_single_create']:.2f}x of the empty one",
    )
    versus = data.get("fork_versus_baseline")
    if not versus:
        return [
            f"- fork(10) with {args.fork_mb} MB in /workspace over an empty one (target <= 1.5x): {main[0]}",
            f"- fork(10) all Ready over one cold create of the snapshot (target <= 3x): {main[1]}",
        ]
    pairs = versus["this"]["pair_ratios"]

    def middle(key: str) -> str:
        row = pairs[key]
        return f"**{row['p50']:.2f}x** (the turns' {row['min']:.2f}-{row['max']:.2f}x)"

    full, cpu = middle("fork_full_over_empty"), pairs["fork_full_over_empty_cpu"]["p50"]
    return [
        f"- fork(10) with {args.fork_mb} MB in /workspace over an empty one (target <= 1.5x), the A/B's "
        f"pairs on this tree: {full}; in CPU {cpu:.2f}x; {main[0]}",
        "- fork(10) all Ready over one cold create of the snapshot (target <= 3x), the A/B's pairs: "
        f"{middle('fork10_empty_over_single_create')} of the empty parent, "
        f"{middle('fork10_full_over_single_create')} of the {args.fork_mb} MB one; {main[1]}",
        f"- that cold create over one of the plain image (the A/B's pairs): {middle('single_create_over_plain')}",
    ]


def versus_table(versus: dict[str, Any] | None, args: argparse.Namespace) -> list[str]:
    """The A/B's section: this tree's gateway, and `--baseline-src`'s when given."""
    if not versus:
        return []
    sides = [side for side in ("baseline", "this") if side in versus]
    against = f" against `{args.baseline_src}`, taking turns" if "baseline" in versus else ""
    lines = [
        "",
        f"## fork(10) and a cold create, in turns: this tree{against} ({args.ab_repeats} each)",
        "",
        "| case | "
        + " | ".join(f"{s} p50 ms | {s} CPU p50 ms | {s} gateway CPU in the call p50 ms" for s in sides)
        + " |",
        "|---" * (1 + 3 * len(sides)) + "|",
    ]
    for key in versus["this"]:
        if key == "pair_ratios":
            continue
        cells = [versus[side][key] for side in sides]
        shown = [f"{c['p50']:.1f} | {c['cpu_ms']['p50']:.0f} | {c['call_cpu_ms']['p50']:.1f}" for c in cells]
        lines.append(f"| {key} | " + " | ".join(shown) + " |")
    lines += ["", "Each turn's ratios on one gateway, p50 (the turns' min-max):", ""]
    for key in versus["this"]["pair_ratios"]:
        cells = [versus[side]["pair_ratios"][key] for side in sides]
        shown = [
            f"{side} {c['p50']:.2f}x ({c['min']:.2f}-{c['max']:.2f})" for side, c in zip(sides, cells, strict=True)
        ]
        lines.append(f"- {key}: " + ", ".join(shown))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="samples per snapshot and fork row")
    parser.add_argument("--creates", type=int, default=10, help="warm creates per pool (and each pool's replicas)")
    parser.add_argument("--max-mb", type=int, default=100, help="the most written before a snapshot")
    parser.add_argument("--mid-mb", type=int, default=10, help="written over the small and the big image")
    parser.add_argument("--big-mb", type=int, default=200, help="the big image's extra layer")
    parser.add_argument("--fork-mb", type=int, default=200, help="the fork parent's /workspace")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="also fork on a gateway of this src/ directory (e.g. `git archive main src`), taking turns",
    )
    parser.add_argument(
        "--ab-repeats", type=int, default=20, help="turns of the A/B (forks, cold creates), per side; 0: none"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: images of the image store need a gateway run as root")
    with tempfile.TemporaryDirectory(prefix="ws-bench-snapshots-") as tmp:
        data = asyncio.run(measure(args, Path(tmp)))
    found = ratios(data, args)
    write_results("snapshots", {**data, "ratios": found}, table(data, found, args))


if __name__ == "__main__":
    main()
