"""The supervisors of local sandboxes, run host-side in the gateway process.

Each sandbox still has its own `Supervisor` speaking the one protocol every driver uses (bootstrap
credential -> RegisterSupervisor, parked until activated -> ConnectSupervisor), so warm and cold
keep one path; it only starts processes through the sandbox's agent instead of as its children.
In a gateway they reach its supervisor service in process (`use`: the gateway's link, through the
same handlers and checks, without HTTP/2 or serialisation); a driver used without one shares a
few gRPC channels to the supervisor socket. Either way a warm member costs a registration, not an
interpreter. The workload's and every exec's environment is built from the request and the
image alone: the base environment is the image's `Env` (empty for the host root), so nothing of the
gateway's leaks in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from warmshell.core.ids import InstanceId
from warmshell.sandboxio.link import GatewayLink, GrpcLink
from warmshell.sandboxio.processes import Runner
from warmshell.supervisor.main import Supervisor, SupervisorSettings

__all__ = ["GatewayLink", "HostSupervisors", "Seat", "Supervise"]


@dataclass(frozen=True)
class Seat:
    """What a host-side supervisor is given: who it is and how it starts processes."""

    instance_id: InstanceId
    credential: str = field(repr=False)
    runner: Runner
    # The workload's base environment and directory (an image's Env and WorkingDir; the request's
    # environment goes on top).
    environment: dict[str, str] = field(default_factory=dict)
    workdir: str = ""


# Runs one sandbox's supervisor until it ends; its exit status.
Supervise = Callable[[Seat], Coroutine[Any, Any, int]]


class HostSupervisors:
    """The real supervisors, over the gateway's in-process link once given one (`use`), else
    over a few shared channels (opened on demand, in the running loop).

    A channel is one HTTP/2 connection, and the gateway serves at most
    `listening.MAX_STREAMS_PER_CONNECTION` streams on one; every supervisor holds one or two at
    a time (its registration, then its session) and more while it relays calls. So at most
    `supervisors_per_channel` supervisors share a channel, and each channel keeps a subchannel
    of its own (gRPC would otherwise share one connection among channels to the same target)."""

    def __init__(self, supervisor_socket: Path, *, supervisors_per_channel: int = 32) -> None:
        self._target = f"unix:{supervisor_socket}"
        self._per_channel = supervisors_per_channel
        self._channels: dict[grpc.aio.Channel, int] = {}  # channel -> supervisors using it
        self._link: GatewayLink | None = None

    def use(self, link: GatewayLink) -> None:
        """Run every supervisor started from now on over `link`."""
        self._link = link

    async def __call__(self, seat: Seat) -> int:
        """Run the supervisor of one sandbox (see `Supervisor.run`)."""
        if self._link is not None:
            return await self._run(seat, self._link)
        channel = self._channel_with_room()
        self._channels[channel] += 1
        try:
            return await self._run(seat, GrpcLink(channel))
        finally:
            if channel in self._channels:
                self._channels[channel] -= 1

    async def _run(self, seat: Seat, link: GatewayLink) -> int:
        settings = SupervisorSettings(gateway=self._target, credential=seat.credential, instance_id=seat.instance_id)
        base = dict(seat.environment)
        return await Supervisor(settings, base, runner=seat.runner, link=link, workdir=seat.workdir).run()

    def _channel_with_room(self) -> grpc.aio.Channel:
        """The fullest channel with room (so idle channels stay few), or a new one."""
        roomy = [c for c, n in self._channels.items() if n < self._per_channel]
        if roomy:
            return max(roomy, key=self._channels.__getitem__)
        channel = grpc.aio.insecure_channel(self._target, options=[("grpc.use_local_subchannel_pool", 1)])
        self._channels[channel] = 0
        return channel

    async def aclose(self) -> None:
        """Close every channel."""
        channels, self._channels = list(self._channels), {}
        await asyncio.gather(*(channel.close(grace=None) for channel in channels))
