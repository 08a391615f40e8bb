"""An in-process gateway on real sockets with the real local driver, and an authenticated stub."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.config import load_config
from warmshell.drivers.local.runtime import runtimedir
from warmshell.gateway.server import Gateway
from warmshell.gateway.store.base import Store, StoredObject


@dataclass
class RunningGateway:
    gateway: Gateway
    stub: sandbox_pb2_grpc.SandboxServiceStub
    channel: grpc.aio.Channel
    token: str
    stopped: bool = False

    async def stop(self) -> None:
        """Stop the gateway now (as SIGTERM would), leaving its sandboxes to their fate."""
        await self.gateway.stop()
        self.stopped = True

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    async def create(self, **fields: Any) -> pb.Sandbox:
        spec = fields.pop("spec", None) or pb.SandboxSpec()
        return await self.stub.CreateSandbox(pb.CreateSandboxRequest(spec=spec, **fields), metadata=self.metadata)

    async def get(self, name: str, workspace: str = "") -> pb.Sandbox:
        return await self.stub.GetSandbox(pb.SandboxRef(name=name, workspace=workspace), metadata=self.metadata)

    async def wait_for(
        self, name: str, predicate: Callable[[pb.Sandbox], bool], timeout: float = 20.0, workspace: str = ""
    ) -> pb.Sandbox:
        """Follow WatchSandbox until the predicate holds (no polling sleeps); a timeout fails with
        the last state seen, so a flaky wait says what the sandbox was doing."""
        request = pb.WatchSandboxRequest(name=name, workspace=workspace)
        last: pb.Sandbox | None = None
        watch = self.stub.WatchSandbox(request, metadata=self.metadata)
        try:
            async with asyncio.timeout(timeout):
                async for event in watch:
                    if event.HasField("sandbox"):
                        last = event.sandbox
                        if predicate(last):
                            return last
        except TimeoutError:
            raise AssertionError(f"{name}: condition not met in {timeout}s; last seen:\n{last}") from None
        finally:
            watch.cancel()  # a watch left open would end only with the gateway
        raise AssertionError(f"watch of {name} ended before the condition held; last seen:\n{last}")

    async def wait_ready(self, name: str, timeout: float = 20.0, workspace: str = "") -> pb.Sandbox:
        return await self.wait_for(
            name,
            lambda s: s.status.phase in (pb.SANDBOX_PHASE_READY, pb.SANDBOX_PHASE_ERROR, pb.SANDBOX_PHASE_EXITED),
            timeout,
            workspace,
        )

    async def exec(self, name: str, command: list[str], **fields: Any) -> tuple[int, bytes, bytes]:
        out, err, code = b"", b"", -1
        request = pb.ExecSandboxRequest(name=name, command=command, **fields)
        async for event in self.stub.ExecSandbox(request, metadata=self.metadata):
            kind = event.WhichOneof("event")
            if kind == "stdout":
                out += event.stdout
            elif kind == "stderr":
                err += event.stderr
            else:
                code = event.exit_code
        return code, out, err

    async def delete(self, name: str, workspace: str = "") -> None:
        await self.stub.DeleteSandbox(pb.SandboxRef(name=name, workspace=workspace), metadata=self.metadata)


@asynccontextmanager
async def running_gateway(state_dir: Path, **overrides: Any) -> AsyncIterator[RunningGateway]:
    """Start a gateway in this process (real gRPC on Unix sockets, real bwrap'd supervisors)."""
    settings = {"state_dir": str(state_dir), "http_port": 0, "orphan_grace_seconds": 2.0, **overrides}
    config = load_config(None, settings)
    gateway = Gateway(config)
    await gateway.start()
    token = config.paths.api_token.read_text().strip()
    channel = grpc.aio.insecure_channel(f"unix://{config.paths.socket}")
    running = RunningGateway(gateway, sandbox_pb2_grpc.SandboxServiceStub(channel), channel, token)
    try:
        yield running
    finally:
        await channel.close(grace=None)
        if not running.stopped:
            await _delete_all(gateway)
            await gateway.stop()


async def _delete_all(gateway: Gateway) -> None:
    """Tests own their sandboxes: remove whatever is left so no process outlives the test."""
    for record in await gateway.parts.records.list():
        try:
            await gateway.parts.manager.delete(record.workspace, record.name)
        except Exception:
            await gateway.parts.driver.delete(record.id)


async def wait_pools(
    gw: RunningGateway, predicate: Callable[[pb.ListPoolsResponse], bool], timeout: float = 30.0
) -> pb.ListPoolsResponse:
    """Poll ListPools (pools have no watch) until the predicate holds, or fail with the last view."""
    last = None
    async with asyncio.timeout(timeout):
        while True:
            last = await gw.stub.ListPools(pb.ListPoolsRequest(all_workspaces=True), metadata=gw.metadata)
            if predicate(last):
                return last
            await asyncio.sleep(0.05)
    raise AssertionError(f"pools never satisfied the condition: {last}")


def pool_named(response: pb.ListPoolsResponse, name: str) -> pb.Pool | None:
    return next((p for p in response.pools if p.name == name), None)


@contextmanager
def own_sandbox_dir(prefix: str) -> Iterator[Path]:
    """A `local.sandbox_dir` of the caller's own, outside pytest's 0700 tmp_path (sandbox uids
    must reach it); removed afterwards, with the runtime directory named for it."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o711)
    try:
        yield base / "sandboxes"
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(runtime_dir_of(base / "sandboxes"), ignore_errors=True)


def runtime_dir_of(sandbox_dir: Path) -> Path:
    """The runtime directory a root gateway with this `local.sandbox_dir` (and no
    `local.runtime_dir`) keeps its sandboxes' egress directories and uid leases in."""
    return runtimedir.choose(None, sandbox_dir, runtimedir.host_tmpfs())


def count_updates(store: Store, monkeypatch: Any) -> list[str]:
    """From now on, the id of every row `store` updates, in order (`monkeypatch`: pytest's)."""
    updated: list[str] = []
    update = store.update

    async def counted(*, kind: str, id: str, expected_version: int, payload: str) -> StoredObject:
        updated.append(id)
        return await update(kind=kind, id=id, expected_version=expected_version, payload=payload)

    monkeypatch.setattr(store, "update", counted)
    return updated
