"""The supervisors of local sandboxes, run host-side in the gateway process.

Each sandbox still has its own `Supervisor` speaking the one protocol every driver uses (bootstrap
credential -> RegisterSupervisor, parked until activated -> ConnectSupervisor), so warm and cold
keep one path; it only starts processes through the sandbox's agent instead of as its children.
All of them share one gRPC channel to the gateway's supervisor socket, so a warm member costs a
registration stream, not an interpreter. The workload's and every exec's environment is built
from the request alone: the base environment is empty, so nothing of the gateway's leaks in.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from warmshell.core.ids import InstanceId
from warmshell.supervisor.main import Supervisor, SupervisorSettings
from warmshell.supervisor.processes import Runner

__all__ = ["HostSupervisors", "Seat", "Supervise"]


@dataclass(frozen=True)
class Seat:
    """What a host-side supervisor is given: who it is and how it starts processes."""

    instance_id: InstanceId
    credential: str = field(repr=False)
    runner: Runner


# Runs one sandbox's supervisor until it ends; its exit status.
Supervise = Callable[[Seat], Coroutine[Any, Any, int]]


class HostSupervisors:
    """The real supervisors, over one channel (opened on first use, in the running loop)."""

    def __init__(self, supervisor_socket: Path) -> None:
        self._target = f"unix:{supervisor_socket}"
        self._channel: grpc.aio.Channel | None = None

    async def __call__(self, seat: Seat) -> int:
        """Run the supervisor of one sandbox (see `Supervisor.run`)."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._target)
        settings = SupervisorSettings(gateway=self._target, credential=seat.credential, instance_id=seat.instance_id)
        return await Supervisor(settings, {}, runner=seat.runner, channel=self._channel).run()

    async def aclose(self) -> None:
        """Close the shared channel."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close(grace=None)
