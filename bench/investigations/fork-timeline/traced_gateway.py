"""`python -m warmshell ...` with the steps of each fork and of each create timed, for
`fork_timeline.py`: where a fork(10)'s wall time goes.

Stamps are unix microseconds (`time.time_ns() // 1000`, the clock of a record's timeline, so
they line up with each child's `requested`/`registered`/`activated`/`ready`). Per snapshot (a
list, one entry per `Snapshots.take`): `take` (the event loop asks), `thread` (the worker thread
begins), `begun` (index read, staging made), `frozen`, `captured`, `thawed`, `committed`,
`returned` (back in the event loop). Per sandbox id: `create` (the manager's create begins),
`inserted` (its Provisioning record written), `sealed` (its secrets), `driver` (the driver's
create begins), `hop` (the launcher hands the start to a spawner thread), `thread` (the spawner
thread begins), `prepared` (uid, directories, cgroup, image root), `exec` (bwrap runs), `hello`
(the agent said hello), `driver_done`, `release_begin` (the manager asks for the create's result to be written),
`store_sent`, `store_done` (its first update in the SQLite store: that write), `released`, `settled` (the
fork's wait for Ready returns). SIGUSR2 writes them as JSON to `trace.json` in the gateway's
`--state-dir` and forgets them. The wrappers cost microseconds; read the figures beside an
untraced run."""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

from warmshell.drivers.local import fleet, snapshots
from warmshell.drivers.local.imagestore import store
from warmshell.drivers.local.runtime import launching, processes
from warmshell.gateway import manager, records, snapshot_calls
from warmshell.gateway.store import sqlite

_children: defaultdict[str, dict[str, int]] = defaultdict(dict)
_snapshots: list[dict[str, int]] = []
_current = threading.local()  # the sandbox the spawner thread is starting


def _now() -> int:
    return time.time_ns() // 1000


def _stamp(sandbox_id: str | None, step: str) -> None:
    if sandbox_id:
        _children[sandbox_id].setdefault(step, _now())


def _wrap(owner: Any, name: str, before: str | None, after: str | None) -> None:
    """Stamp the current snapshot's `before` and `after` around the blocking method `name`."""
    original = getattr(owner, name)

    def traced(*args: Any, **kwargs: Any) -> Any:
        if before and _snapshots:
            _snapshots[-1][before] = _now()
        result = original(*args, **kwargs)
        if after and _snapshots:
            _snapshots[-1][after] = _now()
        return result

    setattr(owner, name, traced)


def _patch_snapshots() -> None:
    take = snapshots.Snapshots.take

    async def traced_take(self: Any, *args: Any, **kwargs: Any) -> Any:
        _snapshots.append({"take": _now()})
        result = await take(self, *args, **kwargs)
        _snapshots[-1]["returned"] = _now()
        return result

    snapshots.Snapshots.take = traced_take  # type: ignore[method-assign]
    _wrap(snapshots.Snapshots, "_begin", "thread", "begun")
    _wrap(snapshots.Snapshots, "_capture", "frozen", "captured")
    _wrap(snapshots.Snapshots, "_capture_frozen", None, "thawed")
    _wrap(store.ImageStore, "commit", None, "committed")


def _patch_creates() -> None:
    create = manager.SandboxManager._create
    insert = manager.SandboxManager._insert

    async def traced_create(self: Any, new: Any) -> Any:
        started = _now()
        record = await create(self, new)
        _children[record.id].setdefault("create", started)
        _stamp(record.id, "released")
        return record

    async def traced_insert(self: Any, *args: Any, **kwargs: Any) -> Any:
        record = await insert(self, *args, **kwargs)
        _stamp(record.id, "inserted")
        return record

    release = records.SandboxRecords.release

    async def traced_release(self: Any, sandbox_id: Any, *args: Any, **kwargs: Any) -> Any:
        _stamp(sandbox_id, "release_begin")
        return await release(self, sandbox_id, *args, **kwargs)

    records.SandboxRecords.release = traced_release  # type: ignore[method-assign]
    update = sqlite.SqliteStore.update

    async def traced_update(self: Any, **kwargs: Any) -> Any:
        _stamp(kwargs["id"], "store_sent")
        row = await update(self, **kwargs)
        _stamp(kwargs["id"], "store_done")
        return row

    sqlite.SqliteStore.update = traced_update  # type: ignore[method-assign]
    manager.SandboxManager._create = traced_create  # type: ignore[method-assign]
    manager.SandboxManager._insert = traced_insert  # type: ignore[method-assign]
    fork_child = snapshot_calls.SnapshotCalls._fork_child

    async def traced_fork_child(self: Any, *args: Any, **kwargs: Any) -> Any:
        child = await fork_child(self, *args, **kwargs)
        _stamp(child.sandbox.id, "settled")
        return child

    snapshot_calls.SnapshotCalls._fork_child = traced_fork_child  # type: ignore[method-assign]


def _patch_launches() -> None:
    launch = fleet.Fleet.launch
    start = launching.Launcher.start
    popen = processes._popen

    async def traced_launch(self: Any, instance: Any, spec: Any, **kwargs: Any) -> None:
        _stamp(instance.sandbox_id, "driver")
        await launch(self, instance, spec, **kwargs)
        _stamp(instance.sandbox_id, "driver_done")

    async def traced_start(self: Any, instance: Any, **kwargs: Any) -> Any:
        prepare = kwargs.get("prepare")
        sandbox_id = getattr(instance, "sandbox_id", None)

        def traced_prepare() -> None:
            _current.sandbox_id = sandbox_id
            _stamp(sandbox_id, "thread")
            if prepare is not None:
                prepare()
            _stamp(sandbox_id, "prepared")

        kwargs["prepare"] = traced_prepare
        _stamp(sandbox_id, "hop")
        sandbox = await start(self, instance, **kwargs)
        _stamp(sandbox_id, "hello")
        return sandbox

    def traced_popen(*args: Any, **kwargs: Any) -> Any:
        result = popen(*args, **kwargs)
        _stamp(getattr(_current, "sandbox_id", None), "exec")
        return result

    fleet.Fleet.launch = traced_launch  # type: ignore[method-assign]
    launching.Launcher.start = traced_start  # type: ignore[method-assign]
    processes._popen = traced_popen


def _dump(_signum: int, _frame: FrameType | None) -> None:
    target = str(Path(sys.argv[sys.argv.index("--state-dir") + 1]) / "trace.json")
    with open(target + ".tmp", "w") as handle:
        json.dump({"snapshots": list(_snapshots), "children": dict(_children)}, handle)
    os.replace(target + ".tmp", target)  # whole, for a reader polling for it
    _snapshots.clear()
    _children.clear()


if __name__ == "__main__":
    _patch_snapshots()
    _patch_creates()
    _patch_launches()
    signal.signal(signal.SIGUSR2, _dump)
    sys.argv = ["warmshell", *sys.argv[1:]]
    runpy.run_module("warmshell", run_name="__main__", alter_sys=True)
