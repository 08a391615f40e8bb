"""Issue 30 benchmark: sandboxes from images of the image store next to host-root sandboxes, in one
run on one gateway (local driver, run as root: images of the store need it).

- cold create -> Ready with a Debian minbase image (~170 MB, made by mmdebstrap and cached per
  machine: tests/helpers/debian.py) vs the host root (target <= 1.3x);
- warm create -> Ready from a pool of that image vs from a host-root pool (target <= 1.1x);
- cold create -> Ready against image size: a ~3 MB image, the Debian one, and the Debian one with a
  layer of `--big-mb` MB of incompressible files on top (flat: no sandbox copies its image);
- the disk used by `--many` sandboxes of one image, each having written 1 MB into the image's
  directories: the store is not copied, and what they wrote is in their tmpfs upper layers (memory,
  counted as the host's Shmem), not on disk.

Run as root from the repository root: `python bench/images.py --creates 10 --many 50`.
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
from typing import Any

from harness import GatewayProcess, gateway_process, summary, write_results

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests/helpers builds images
from tests.helpers import debian, images

IMAGES = {"tiny": "bench/tiny:1", "debian": "bench/debian:12", "big": "bench/big:1"}


def big_layer(megabytes: int) -> bytes:
    layer = images.Layer()
    for n in range(megabytes):
        layer.file(f"opt/big/f{n}", os.urandom(1 << 20))
    return layer.tar()


def import_all(state: Path, work: Path, big_mb: int) -> dict[str, int]:
    """Import the three images into the gateway's store; their sizes in bytes."""
    store = ImageStore(state / "images", max_bytes=64 << 30)
    store.open()
    images.write_oci_layout(work / "tiny", [images.host_shell_layer().tar()], ref_name=IMAGES["tiny"])
    debian.write_debian_docker_save(work / "debian.tar", debian.debian_rootfs_tar(), tag=IMAGES["debian"])
    sizes = {}
    for key, source in (("tiny", work / "tiny"), ("debian", work / "debian.tar")):
        image, _ = import_image(store, source, name=IMAGES[key])
        sizes[key] = store.index().image_size(image)
    base = store.resolve(IMAGES["debian"])
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        layers = [Path(store.layer_path(d)) for d in base.layers]
        debian_layer = subprocess.run(["tar", "-C", str(layers[0]), "-cf", "-", "."], capture_output=True, check=True)
        images.write_oci_layout(Path(tmp), [debian_layer.stdout, big_layer(big_mb)], compress=False)
        image, _ = import_image(store, Path(tmp), name=IMAGES["big"])
        sizes["big"] = store.index().image_size(image)
    return sizes


async def interleaved_creates(gw: GatewayProcess, specs: dict[str, pb.SandboxSpec], count: int) -> dict[str, Any]:
    """`count` creates -> Ready of each spec, one of each in turn: on a loaded host the load drifts
    over a run, and rows measured one after the other would differ by the drift alone."""
    samples: dict[str, tuple[list[float], list[float], set[str]]] = {key: ([], [], set()) for key in specs}
    for i in range(count):
        for key, spec in specs.items():
            name = f"{key.replace('_', '-')}-{i}"
            start = time.perf_counter()
            ready = await gw.create_ready(name=name, spec=spec)
            client_ms, server_ms, served = samples[key]
            client_ms.append((time.perf_counter() - start) * 1000)
            timeline = ready.status.timeline
            server_ms.append((timeline.ready_us - timeline.requested_us) / 1000)
            served.add(ready.status.allocation)
            await gw.delete(name)
    return {
        key: {"client_ms": summary(c), "server_ms": summary(s), "allocations": sorted(a)}
        for key, (c, s, a) in samples.items()
    }


async def wait_idle(gw: GatewayProcess, pools: dict[str, int], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        listed = {p.name: p.idle for p in (await gw.pools()).pools}
        if all(listed.get(name, 0) >= want for name, want in pools.items()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pools never filled: {listed}")
        await asyncio.sleep(0.2)


def shmem_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1])
    return 0


def disk_kib(path: Path) -> int:
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


async def many(gw: GatewayProcess, count: int) -> dict[str, Any]:
    """`count` sandboxes of the Debian image, each writing 1 MB into /usr/lib: disk and memory."""
    disk_before, shmem_before = disk_kib(gw.state), shmem_kib()
    for i in range(count):
        await gw.create(
            name=f"many-{i}", spec=pb.SandboxSpec(image=IMAGES["debian"], environment={"POOL": "many"}, no_command=True)
        )
    for i in range(count):
        await gw.wait_ready(f"many-{i}")
        request = pb.ExecSandboxRequest(
            name=f"many-{i}", command=["sh", "-c", "head -c 1048576 /dev/urandom > /usr/lib/written"]
        )
        async for _ in gw.stub.ExecSandbox(request, metadata=gw.metadata):
            pass
    result = {
        "sandboxes": count,
        "state_dir_disk_kib_delta": disk_kib(gw.state) - disk_before,
        "host_shmem_kib_delta": shmem_kib() - shmem_before,
        "store_disk_kib": disk_kib(gw.state / "images"),
    }
    for i in range(count):
        await gw.delete(f"many-{i}")
    return result


async def measure(creates: int, many_count: int, big_mb: int, work: Path) -> dict[str, Any]:
    pools = work / "pools"
    pools.mkdir()
    for name, image in (("host", ""), ("debian", IMAGES["debian"])):
        line = f'image = "{image}"\n' if image else ""
        profile = f'version = 1\nworkspace = "default"\nreplicas = {creates}\n{line}[environment]\nPOOL = "{name}"\n'
        (pools / f"{name}.toml").write_text(profile)
    async with gateway_process("--pools", str(pools)) as gw:
        sizes = await asyncio.to_thread(import_all, gw.state, work, big_mb)
        data: dict[str, Any] = {"image_bytes": sizes}
        cold = {"cold_host": pb.SandboxSpec(environment={"POOL": "cold"})}
        for key, image in IMAGES.items():
            # The image runs nothing, as the host root does: the Debian image's Cmd (bash) would exit.
            cold[f"cold_{key}"] = pb.SandboxSpec(image=image, environment={"POOL": "cold"}, no_command=True)
        data.update(await interleaved_creates(gw, cold, creates))
        await wait_idle(gw, {"host": creates, "debian": creates})
        warm = {
            "warm_host": pb.SandboxSpec(environment={"POOL": "host"}),
            "warm_debian": pb.SandboxSpec(image=IMAGES["debian"], environment={"POOL": "debian"}, no_command=True),
        }
        data.update(await interleaved_creates(gw, warm, creates))
        data["many"] = await many(gw, many_count)
    return data


def table(data: dict[str, Any]) -> str:
    rows = "| create -> Ready (client) | image bytes | n | p50 ms | p90 ms | served |\n|---|---|---|---|---|---|\n"
    for key in ("cold_host", "cold_tiny", "cold_debian", "cold_big", "warm_host", "warm_debian"):
        s, image = data[key]["client_ms"], key.split("_")[1]
        size = data["image_bytes"].get(image, 0)
        rows += f"| {key} | {size} | {s['n']} | {s['p50']:.2f} | {s['p90']:.2f} | {data[key]['allocations']} |\n"
    ratios = data["ratios"]
    many = data["many"]
    return rows + (
        f"\nCold image/host p50: **{ratios['cold_debian_over_host']:.2f}x** (target <= 1.3x); warm image/host "
        f"pool p50: **{ratios['warm_debian_over_host']:.2f}x** (target <= 1.1x); cold big/tiny p50: "
        f"**{ratios['cold_big_over_tiny']:.2f}x** (flat is 1x).\n\n{many['sandboxes']} sandboxes of the Debian "
        f"image, each having written 1 MB into /usr/lib: the state directory grew by "
        f"{many['state_dir_disk_kib_delta']} KiB on disk (the store holds {many['store_disk_kib']} KiB, once); "
        f"the host's Shmem (their tmpfs upper layers) by {many['host_shmem_kib_delta']} KiB.\n\n"
        f"Load average (1, 5, 15 min) at the start and the end: {data['load_start']} / {data['load']} on "
        f"{os.cpu_count()} cpus shared with other work: every figure is noisy; rows are interleaved so that "
        "the drift of the load falls on each alike.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--creates", type=int, default=20, help="creates per row (and each pool's replicas)")
    parser.add_argument("--many", type=int, default=50, help="sandboxes of one image for the disk figure")
    parser.add_argument("--big-mb", type=int, default=512, help="the big image's extra layer, in MB")
    parser.add_argument("--name", default="images", help="results file name under bench/results/")
    args = parser.parse_args()
    load_start = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="ws-bench-images-") as work:
        data = asyncio.run(measure(args.creates, args.many, args.big_mb, Path(work)))
    p50 = {
        key: value["client_ms"]["p50"]
        for key, value in data.items()
        if isinstance(value, dict) and "client_ms" in value
    }
    data["ratios"] = {
        "cold_debian_over_host": p50["cold_debian"] / p50["cold_host"],
        "warm_debian_over_host": p50["warm_debian"] / p50["warm_host"],
        "cold_big_over_tiny": p50["cold_big"] / p50["cold_tiny"],
    }
    data["load_start"], data["load"] = load_start, [round(x, 2) for x in os.getloadavg()]
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
