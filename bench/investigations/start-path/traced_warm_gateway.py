"""`python -m warmshell ...` with the steps of a local warm create timed, for `warm_steps.py`, on
this tree or an older one (74935cd): the same methods are wrapped wherever each tree keeps them.

Each wrapped coroutine method records its wall time per call (`time.perf_counter()`, one clock
for the process); SIGUSR1 clears what was recorded (the warm-up), SIGUSR2 writes every step's
durations so far as JSON to the file named by `WARMSHELL_TRACE`. A wrapper costs a microsecond
or two per call, alike on both trees."""

from __future__ import annotations

import functools
import importlib
import json
import os
import runpy
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

# (step, candidate modules (the first that imports is used), class, method); the steps of a warm
# create in the order they run: the service call spans all, `_activate` from the claim on.
STEPS = (
    ("manager.create", ("warmshell.gateway.manager",), "SandboxManager", "create"),
    ("driver.create", ("warmshell.drivers.local.driver",), "LocalDriver", "create"),
    ("driver._activate", ("warmshell.drivers.local.driver",), "LocalDriver", "_activate"),
    (
        "process.responsive",
        ("warmshell.drivers.local.runtime.processes", "warmshell.drivers.local.processes"),
        "SandboxProcess",
        "responsive",
    ),
    (
        "process.prioritise",
        ("warmshell.drivers.local.runtime.processes", "warmshell.drivers.local.processes"),
        "SandboxProcess",
        "prioritise",
    ),
    ("driver._rename", ("warmshell.drivers.local.driver",), "LocalDriver", "_rename"),
    ("activator.activate", ("warmshell.gateway.activation",), "GatewayActivator", "activate"),
    ("activator._record", ("warmshell.gateway.activation",), "GatewayActivator", "_record"),
    ("egress.attach", ("warmshell.gateway.egress.gate",), "EgressGate", "attach"),
)

_durations: defaultdict[str, list[float]] = defaultdict(list)


def _timed(step: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            _durations[step].append((time.perf_counter() - start) * 1000)

    return timed


def _patch() -> list[str]:
    """Wrap every step this tree has; the steps it has."""
    found = []
    for step, modules, class_name, method_name in STEPS:
        for name in modules:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            owner = getattr(module, class_name, None)
            if owner is not None and hasattr(owner, method_name):
                setattr(owner, method_name, _timed(step, getattr(owner, method_name)))
                found.append(step)
                break
    return found


def _clear(_signum: int, _frame: FrameType | None) -> None:
    _durations.clear()


def _write(_signum: int, _frame: FrameType | None) -> None:
    with open(os.environ["WARMSHELL_TRACE"], "w") as out:
        json.dump(dict(_durations), out)


if __name__ == "__main__":
    _patch()
    signal.signal(signal.SIGUSR1, _clear)
    signal.signal(signal.SIGUSR2, _write)
    sys.argv = ["warmshell", *sys.argv[1:]]
    runpy.run_module("warmshell", run_name="__main__", alter_sys=True)
