"""`python -m warmshell ...` with the steps of each local member start timed, for
`member_fill.py --trace`: where a start waits (a spawn slot, the hop to the spawner thread, the
spawner's own work, bwrap and the agent until its hello, the registration after it).

Each member gets `time.perf_counter()` stamps (one clock for every thread of the process):
`queued` (the pool asked for it), `slot` (a spawn slot was free), `hop` (the event loop handed
the start to the spawner thread), `thread` (the spawner thread began its work), `exec` (its
`Popen` returned: bwrap runs), `hello` (the agent said hello: the slot is free again) and
`registered` (its supervisor registered: the member is idle). SIGUSR2 writes every member's
stamps so far as JSON to the file named by `WARMSHELL_TRACE`. The wrappers cost a few
microseconds per step; read the figures beside an untraced round."""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
import time
from collections import defaultdict
from types import FrameType
from typing import Any

from warmshell.drivers.local import fleet
from warmshell.drivers.local.pools import members, pooling
from warmshell.drivers.local.runtime import launching, processes

_stamps: defaultdict[str, dict[str, float]] = defaultdict(dict)
_current = threading.local()  # the instance the spawner thread is starting


def _stamp(instance_id: str, step: str) -> None:
    _stamps[instance_id].setdefault(step, time.perf_counter())


def _patch() -> None:
    pool_spawn = pooling.PoolSet._spawn
    member_spawn = members.FleetMembers.spawn
    fleet_launch = fleet.Fleet.launch
    launcher_start = launching.Launcher.start
    popen = processes._popen
    registered = pooling.PoolSet.member_registered
    queued: list[float] = []  # stamps of `_spawn` calls whose instance does not exist yet

    async def traced_pool_spawn(self: Any, pool: Any) -> None:
        queued.append(time.perf_counter())
        await pool_spawn(self, pool)

    async def traced_member_spawn(self: Any, pool: Any) -> Any:
        _current.slot = time.perf_counter()
        _current.queued = queued.pop(0) if queued else _current.slot
        return await member_spawn(self, pool)

    async def traced_launch(self: Any, instance: Any, spec: Any, **kwargs: Any) -> None:
        stamps = _stamps[instance.instance_id]
        stamps["queued"], stamps["slot"] = getattr(_current, "queued", 0.0), getattr(_current, "slot", 0.0)
        await fleet_launch(self, instance, spec, **kwargs)

    async def traced_start(self: Any, instance: Any, **kwargs: Any) -> Any:
        prepare = kwargs.get("prepare")
        instance_id = instance.instance_id

        def traced_prepare() -> None:
            _current.instance_id = instance_id
            _stamp(instance_id, "thread")
            if prepare is not None:
                prepare()

        kwargs["prepare"] = traced_prepare
        _stamp(instance_id, "hop")
        sandbox = await launcher_start(self, instance, **kwargs)
        _stamp(instance_id, "hello")
        return sandbox

    def traced_popen(*args: Any, **kwargs: Any) -> Any:
        result = popen(*args, **kwargs)
        instance_id = getattr(_current, "instance_id", None)
        if instance_id is not None:
            _stamp(instance_id, "exec")
        return result

    def traced_registered(self: Any, member: Any) -> None:
        _stamp(member.instance_id, "registered")
        registered(self, member)

    pooling.PoolSet._spawn = traced_pool_spawn  # type: ignore[method-assign]
    members.FleetMembers.spawn = traced_member_spawn  # type: ignore[method-assign]
    fleet.Fleet.launch = traced_launch  # type: ignore[method-assign]
    launching.Launcher.start = traced_start  # type: ignore[method-assign]
    processes._popen = traced_popen
    pooling.PoolSet.member_registered = traced_registered  # type: ignore[method-assign]


def _dump(_signum: int, _frame: FrameType | None) -> None:
    target = os.environ["WARMSHELL_TRACE"]
    with open(target + ".tmp", "w") as handle:
        json.dump(dict(_stamps), handle)
    os.replace(target + ".tmp", target)  # whole, for a reader polling for it


if __name__ == "__main__":
    _patch()
    signal.signal(signal.SIGUSR2, _dump)
    sys.argv = ["warmshell", *sys.argv[1:]]
    runpy.run_module("warmshell", run_name="__main__", alter_sys=True)
