"""Instance records: one JSON file per local instance bound to a sandbox (cold, or a claimed
pool member) under `StatePaths.instances`; an idle member has none (the sweep removes its
directory as one no record owns).

They outlive the gateway process (its sandboxes do not: they die with it), so the next start can
tell the gateway which sandboxes were lost. A record holds the activation proof of a bound
instance, hence files are 0600 in a 0700 directory and are written atomically. Blocking I/O:
callers run these through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

__all__ = ["InstanceRecord", "load_all", "remove", "remove_partial", "save"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstanceRecord:
    """What survives of one instance on disk."""

    instance_id: str
    credential_digest: str
    workspace: str
    hostname: str
    created_us: int
    pid: int = 0
    sandbox_id: str = ""
    name: str = ""
    activation_proof: str = ""
    allocation: str = "cold"
    pool: str = ""
    pool_name: str = ""
    miss_reason: str = ""

    def __repr__(self) -> str:  # the proof stays out of logs
        return f"InstanceRecord(instance_id={self.instance_id!r}, sandbox_id={self.sandbox_id!r})"


def _path(directory: Path, instance_id: str) -> Path:
    return directory / f"{instance_id}.json"


def save(directory: Path, record: InstanceRecord) -> None:
    """Write (or replace) a record atomically, readable by the gateway's user only."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = _path(directory, record.instance_id)
    partial = final.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(record), handle, sort_keys=True)
    os.replace(partial, final)


def remove(directory: Path, instance_id: str) -> None:
    """Delete a record; a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        _path(directory, instance_id).unlink()


def remove_partial(directory: Path) -> None:
    """Remove the partial writes (`<id>.tmp`) a killed gateway left; only while nothing writes
    records (the start-up sweep). Their instances, if they ran, are found by their logs."""
    if directory.is_dir():
        for partial in directory.glob("*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()


def load_all(directory: Path) -> list[InstanceRecord]:
    """Every readable record; unreadable files are logged and skipped (never fatal)."""
    if not directory.is_dir():
        return []
    known = {f.name for f in fields(InstanceRecord)}
    records: list[InstanceRecord] = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            records.append(InstanceRecord(**{k: v for k, v in data.items() if k in known}))
        except (OSError, ValueError, TypeError) as exc:
            _log.warning("skipping unreadable instance record %s: %s", path, exc)
    return records
