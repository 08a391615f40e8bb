"""Several real gateway processes on one Postgres and one kubesim, behind one address that spreads
connections over them as a Kubernetes Service would.

`Balancer` is a small TCP balancer: each accepted connection goes to the next backend in turn, one
that refuses is skipped (a dead pod leaves the Service's endpoints), and a connection lives and
dies with its backend (a replica killed with SIGKILL drops every stream it carried, so supervisors
reconnect through the balancer to a survivor). `ReplicaSet` starts `warmshell gateway start`
processes with the credentials a chart would mount from Secrets (API token, signing key, gateway
id, proof key, secrets key, replica token) shared, each with its own state directory and replica id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.helpers.prelude import after_prelude
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.config import KubernetesDriverConfig
from warmshell.drivers import keyfiles
from warmshell.gateway.tokens import load_or_create_api_token, load_or_create_signing_key

__all__ = ["Balancer", "Replica", "ReplicaSet", "balancer", "replica_set"]

START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0
_CHUNK = 64 * 1024


class Balancer:
    """Round-robin TCP balancer on 127.0.0.1 over a changing list of backend addresses."""

    def __init__(self, backends: Callable[[], list[str]]) -> None:
        self._backends = backends
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.port = 0
        self.connections: dict[str, int] = {}  # accepted connections per backend

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _connect(self) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter] | None:
        backends = self._backends()
        start = next(self._turn)
        for offset in range(len(backends)):
            backend = backends[(start + offset) % len(backends)]
            host, _, port = backend.rpartition(":")
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                continue  # not listening (dead or stopping): the next endpoint
            return backend, reader, writer
        return None

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            connected = await self._connect()
            if connected is None:
                return
            backend, reader, writer = connected
            self.connections[backend] = self.connections.get(backend, 0) + 1
            try:
                pumps = [
                    asyncio.create_task(_pump(client_reader, writer)),
                    asyncio.create_task(_pump(reader, client_writer)),
                ]
                # Either side closing ends both, as a TCP connection through a dead pod does.
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
            finally:
                writer.close()
        finally:
            client_writer.close()
            self._pipes.discard(task)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._pipes):
                task.cancel()
            await asyncio.gather(*self._pipes, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()  # backpressure: read no faster than the other side takes


@contextlib.asynccontextmanager
async def balancer(backends: Callable[[], list[str]]) -> AsyncIterator[Balancer]:
    running = Balancer(backends)
    await running.start()
    try:
        yield running
    finally:
        await running.aclose()


@dataclass
class Replica:
    """One `warmshell gateway start` process."""

    id: str
    state: Path
    process: subprocess.Popen[bytes]
    tcp: str = ""
    http: str = ""
    egress: str = ""  # the egress proxy's network listener, with [network] proxy_listen
    draining: bool = False  # out of the Service's endpoints (a terminating pod)

    def log(self) -> str:
        path = self.state / "gateway.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def _dying_with_this_process(argv: list[str]) -> list[str]:
    """`argv`, run so that it is SIGKILLed when this (test) process dies, even by SIGKILL (the
    death signal survives exec); it exits at once if this process is already gone."""
    prelude = (
        "import ctypes\n"
        "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL\n"
        f"if os.getppid() != {os.getpid()}:\n"
        "    sys.exit(1)"
    )
    return after_prelude(prelude, argv)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def toml_text(sections: dict[str, dict[str, Any]]) -> str:
    """A config file's text: each section's keys ("" for the top level)."""
    lines: list[str] = []
    for name, values in sections.items():
        if name:
            lines.append(f"[{name}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)


@dataclass
class ReplicaSet:
    """Gateway replicas sharing one store and one cluster, reached through one balancer."""

    root: Path
    store_url: str
    password_file: Path
    driver: KubernetesDriverConfig
    settings: dict[str, Any] = field(default_factory=dict)
    drain_seconds: float = 2.0
    # The tests' short intervals (heartbeats and relists every second, a 3 s Lease, replica
    # heartbeats every 0.5 s), so that failures are seen quickly; False: the gateway's defaults,
    # as a user runs it (a benchmark of a steady load).
    short_intervals: bool = True
    replicas: list[Replica] = field(default_factory=list)
    _names: itertools.count[int] = field(default_factory=itertools.count)
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    @property
    def shared(self) -> Path:
        return self.root / "shared"

    @property
    def token(self) -> str:
        return (self.shared / "api-token").read_text().strip()

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    def prepare(self) -> None:
        """The credentials every replica shares (the chart's Secrets)."""
        self.shared.mkdir(parents=True, exist_ok=True)
        load_or_create_api_token(self.shared / "api-token")
        load_or_create_signing_key(self.shared / "signing-key.pem")
        load_or_create_api_token(self.shared / "replica-token")
        keyfiles.load_or_create_key(self.shared / "proof.key")
        keyfiles.load_or_create_key(self.shared / "secrets.key")
        (self.shared / "gateway-id").write_text("replicas-test\n")

    def backends(self) -> list[str]:
        """The live replicas' gRPC addresses (the Service's endpoints)."""
        return [r.tcp for r in self.replicas if r.alive and r.tcp and not r.draining]

    def _config(self, replica_id: str, state: Path, own: dict[str, Any], network: dict[str, Any]) -> str:
        driver = self.driver.model_dump()
        election = driver.pop("leader_election")
        driver.pop("warm_pooling")
        driver["proof_key_file"] = str(self.shared / "proof.key")
        top = {
            "state_dir": str(state),
            "driver": "kubernetes",
            "listen_tcp": "127.0.0.1:0",
            "http_port": 0,
            "log_level": "INFO",
            "secrets_key_file": str(self.shared / "secrets.key"),
        }
        replicas: dict[str, Any] = {"id": replica_id, "token_file": str(self.shared / "replica-token")}
        election |= {"lease_name": "warmshell-replicas"}
        if self.short_intervals:
            top |= {"orphan_grace_seconds": 2.0, "reconcile_interval_seconds": 1.0, "heartbeat_interval_seconds": 1.0}
            election |= {"lease_duration_seconds": 3, "renew_deadline_seconds": 2.0, "retry_period_seconds": 0.5}
            replicas |= {"heartbeat_seconds": 0.5}
        replicas |= own
        top |= self.settings
        election.pop("identity")
        sections: dict[str, dict[str, Any]] = {"": top}
        if network:
            sections["network"] = network
        if self.store_url:  # else SQLite in the state directory: one gateway, no replicas
            sections["store"] = {"url": self.store_url, "password_file": str(self.password_file)}
        return toml_text(
            sections
            | {
                "replicas": replicas | {"drain_seconds": self.drain_seconds},
                "kubernetes": driver,
                "kubernetes.leader_election": election,
            }
        )

    async def start_one(self, *, network: dict[str, Any] | None = None, **own: Any) -> Replica:
        """Start a new replica (a new pod: new id, new state directory) and wait until it serves;
        `own`: its own [replicas] settings (e.g. a token_file or address of its own); `network`:
        its [network] settings."""
        replica_id = f"gw-{next(self._names)}"
        state = self.root / replica_id
        state.mkdir(mode=0o700, parents=True)
        for name in ("api-token", "signing-key.pem", "gateway-id"):
            shutil.copy(self.shared / name, state / name)
            os.chmod(state / name, 0o600)
        config = self.root / f"{replica_id}.toml"
        config.write_text(self._config(replica_id, state, own, network or {}))
        with (state / "gateway.log").open("wb") as log:
            process = subprocess.Popen(
                _dying_with_this_process(
                    [sys.executable, "-m", "warmshell", "gateway", "start", "--config", str(config)]
                ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        replica = Replica(replica_id, state, process)
        self.replicas.append(replica)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        info = state / "gateway.json"
        while not info.exists():
            if not replica.alive or time.monotonic() > deadline:
                raise AssertionError(f"replica {replica_id} did not start:\n{replica.log()[-4000:]}")
            await asyncio.sleep(0.05)
        data = json.loads(info.read_text())
        replica.tcp, replica.http, replica.egress = data["tcp"], data["http"], data.get("egress", "")
        return replica

    def kill(self, replica: Replica) -> None:
        """SIGKILL: no graceful anything (a crashed pod, a lost node)."""
        replica.process.kill()
        replica.process.wait()

    async def stop(self, replica: Replica) -> None:
        """Out of the endpoints, then SIGTERM and wait (a pod deleted during a rolling update)."""
        replica.draining = True
        if replica.alive:
            replica.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            while replica.alive:
                if time.monotonic() > deadline:
                    replica.process.kill()
                    raise AssertionError(f"replica {replica.id} ignored SIGTERM:\n{replica.log()[-4000:]}")
                await asyncio.sleep(0.05)

    def stub(self, target: str) -> sandbox_pb2_grpc.SandboxServiceStub:
        """A client of `target` (one replica's address, or the balancer's)."""
        channel = grpc.aio.insecure_channel(target)
        self.channels.append(channel)
        return sandbox_pb2_grpc.SandboxServiceStub(channel)

    async def healthz(self, replica: Replica) -> int:
        host, _, port = replica.http.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
            await writer.drain()
            status_line = await reader.readline()
        finally:
            writer.close()
        return int(status_line.split()[1])

    async def aclose(self) -> None:
        for channel in self.channels:
            await channel.close(grace=None)
        for replica in self.replicas:
            if replica.alive:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self.replicas:
            try:
                await asyncio.wait_for(asyncio.to_thread(replica.process.wait), STOP_TIMEOUT_SECONDS)
            except TimeoutError:
                replica.process.kill()
                replica.process.wait()


@contextlib.asynccontextmanager
async def replica_set(
    root: Path, *, store_url: str, password_file: Path, driver: KubernetesDriverConfig, **settings: Any
) -> AsyncIterator[ReplicaSet]:
    """A `ReplicaSet` (no replica started yet); every replica is stopped on exit."""
    replicas = ReplicaSet(root, store_url, password_file, driver, settings)
    replicas.prepare()
    try:
        yield replicas
    finally:
        await replicas.aclose()


async def wait_phase(
    stub: sandbox_pb2_grpc.SandboxServiceStub,
    metadata: Any,
    name: str,
    phases: tuple[int, ...] = (pb.SANDBOX_PHASE_READY,),
    timeout: float = 60.0,
) -> pb.Sandbox:
    """Follow WatchSandbox (reopened when the replica behind it goes away) until a phase holds."""
    last: pb.Sandbox | None = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                # Cancelled once read: a watch left open holds one of the connection's streams
                # (until the collector finds the call) while the server follows the sandbox.
                watch = stub.WatchSandbox(pb.WatchSandboxRequest(name=name), metadata=metadata)
                try:
                    async for event in watch:
                        if event.HasField("sandbox"):
                            last = event.sandbox
                            if last.status.phase in phases:
                                return last
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                finally:
                    watch.cancel()
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"{name}: not in {phases} after {timeout}s; last seen:\n{last}") from None
