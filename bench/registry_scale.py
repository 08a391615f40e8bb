"""Issue 3 benchmark: 1,000 idle registrations held by one gateway — the gateway's RSS per
registration, and activation latency with them present (next to the latency with 10 present).

The gateway runs as its own process (real gRPC, real SQLite, real registry and activator) with the
in-memory FakeDriver standing in for the backend, so the figures are the gateway's alone: 1,000
real bwrap'd supervisors would need ~25 GB and measure the interpreter, not the registry. The
client opens one RegisterSupervisor stream per pending instance, as a supervisor would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from harness import summary, write_results

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc, supervisor_pb2_grpc
from warmshell.api.v1 import supervisor_pb2 as spb

STREAMS_PER_CHANNEL = 100


async def serve(state: Path, instances: int) -> None:
    """Server mode: a gateway with a FakeDriver that has `instances` pending pool members."""
    from warmshell.core.config import load_config
    from warmshell.drivers.fake import FakeDriver
    from warmshell.gateway.server import Gateway

    driver = FakeDriver()
    credentials = [driver.add_warm_instance() for _ in range(instances)]
    gateway = Gateway(load_config(None, {"state_dir": str(state), "http_port": 0}), driver=driver)
    await gateway.start()
    (state / "credentials.json").write_text(json.dumps(credentials))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await gateway.stop()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def wait_pending(state: Path, count: int) -> None:
    """Wait until the gateway reports `count` pending registrations on /metrics."""
    info = json.loads((state / "gateway.json").read_text())
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://{info['http']}/metrics").read())
        for line in body.decode().splitlines():
            if line.startswith("warmshell_registrations_pending ") and float(line.split()[1]) >= count:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError("registrations did not all arrive")


async def run(total: int, activations: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="ws-regscale-") as tmp:
        state = Path(tmp)
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(state), "--instances", str(total)])
        try:
            while not (state / "credentials.json").exists():
                if server.poll() is not None:
                    raise RuntimeError("gateway failed to start")
                await asyncio.sleep(0.05)
            credentials = json.loads((state / "credentials.json").read_text())
            token = (state / "api-token").read_text().strip()
            metadata = (("authorization", f"Bearer {token}"),)
            target = f"unix://{state / 'supervisor.sock'}"
            channels = [grpc.aio.insecure_channel(target) for _ in range(-(-total // STREAMS_PER_CHANNEL))]
            public = grpc.aio.insecure_channel(f"unix://{state / 'gateway.sock'}")
            stub = sandbox_pb2_grpc.SandboxServiceStub(public)
            delivered: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

            async def hold(index: int, credential: str) -> None:
                sup = supervisor_pb2_grpc.SupervisorServiceStub(channels[index // STREAMS_PER_CHANNEL])
                call = sup.RegisterSupervisor(spb.RegisterSupervisorRequest(bootstrap_credential=credential))
                async for activation in call:
                    await delivered.put((activation.sandbox_name, time.perf_counter()))

            async def activate_some(label: str, count: int) -> list[float]:
                samples = []
                for i in range(count):
                    start = time.perf_counter()
                    await stub.CreateSandbox(pb.CreateSandboxRequest(name=f"{label}-{i}"), metadata=metadata)
                    name, at = await delivered.get()
                    assert name == f"{label}-{i}"
                    samples.append((at - start) * 1000)
                return samples

            rss_empty = rss_kib(server.pid)
            few = 10 + activations
            holders = [asyncio.create_task(hold(i, c)) for i, c in enumerate(credentials[:few])]
            await wait_pending(state, few)
            few_latency = await activate_some("few", activations)
            rss_few = rss_kib(server.pid)
            holders += [asyncio.create_task(hold(i, c)) for i, c in enumerate(credentials[few:], start=few)]
            await wait_pending(state, total - activations)
            rss_full = rss_kib(server.pid)
            full_latency = await activate_some("full", activations)
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            for channel in [*channels, public]:
                await channel.close(grace=None)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    held = total - activations
    per_registration = (rss_full - rss_few) * 1024 / (held - (few - activations))
    return {
        "registrations_held": held,
        "gateway_rss_kib": {"empty": rss_empty, "after_few": rss_few, "with_all": rss_full},
        "rss_bytes_per_registration": per_registration,
        "activation_latency_ms_with_10": summary(few_latency),
        "activation_latency_ms_with_1000": summary(full_latency),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", type=Path)
    parser.add_argument("--instances", type=int, default=1050)
    parser.add_argument("--activations", type=int, default=50)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.instances))
        return
    data = asyncio.run(run(args.instances, args.activations))
    few, full = data["activation_latency_ms_with_10"], data["activation_latency_ms_with_1000"]
    ratio = full["p50"] / few["p50"]  # type: ignore[index]
    data["latency_ratio_1000_over_10"] = ratio
    table = (
        "| measurement | value |\n|---|---|\n"
        f"| idle registrations held | {data['registrations_held']} |\n"
        f"| gateway RSS per registration | {data['rss_bytes_per_registration'] / 1024:.1f} KiB |\n"  # type: ignore[operator]
        f"| gateway RSS with all held | {data['gateway_rss_kib']['with_all'] / 1024:.1f} MiB |\n"  # type: ignore[index]
        f"| activation latency p50 / p99, 10 held | {few['p50']:.2f} / {few['p99']:.2f} ms |\n"  # type: ignore[index]
        f"| activation latency p50 / p99, 1000 held | {full['p50']:.2f} / {full['p99']:.2f} ms |\n"  # type: ignore[index]
        f"| ratio (1000 / 10) | {ratio:.2f} |\n"
        "\nActivation latency = CreateSandbox call until the activation message arrives on the matching "
        "RegisterSupervisor stream (persist, driver create, proof check, token mint, stream write).\n"
    )
    write_results("registry_scale", data, table)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
