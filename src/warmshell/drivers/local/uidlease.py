"""Host uids for sandboxes when the gateway runs as root: no two live sandboxes on a host share
one, whichever gateway made them.

Every root gateway on a host draws from `local.sandbox_uid_base` / `local.sandbox_uid_count`
(the same default range), and a shared uid shares every per-uid kernel account: RLIMIT_NPROC
counts the host uid across namespaces and gateways, so a fork bomb in one gateway's sandbox made
every exec in another's fail. So the leases live in one table under `local.sandbox_dir`, which
the gateways of a host share: `<sandbox_dir>/uid-leases`, a line per leased uid naming its
holder (the gateway's name, its pid and that pid's start time), changed only under an exclusive
`flock` of `<sandbox_dir>/uid-leases.lock` and replaced whole (a crash mid-write leaves the old
table). A gateway killed with -9 never gives its leases back: a lease whose holder is gone is
taken back once no process on the host runs as its uid any more (`/proc/*/status`), which is
when its sandbox has really ended. Blocking I/O: callers use a thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.errors import ResourceExhaustedError

__all__ = ["Holder", "UidLeases", "parse", "pick", "reclaimable", "render"]

TABLE = "uid-leases"


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: a gateway (its name on the host) in the process `pid` started at
    `started` (clock ticks since boot, /proc/<pid>/stat: a reused pid is another process)."""

    gateway: str
    pid: int
    started: int


def parse(text: str) -> dict[int, Holder]:
    """The table's leases (pure); a line that is not `uid gateway pid started` is skipped."""
    table: dict[int, Holder] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0].isdigit() and fields[2].isdigit() and fields[3].isdigit():
            table[int(fields[0])] = Holder(fields[1], int(fields[2]), int(fields[3]))
    return table


def render(table: Mapping[int, Holder]) -> str:
    """The table as its file holds it (pure)."""
    return "".join(f"{uid} {h.gateway} {h.pid} {h.started}\n" for uid, h in sorted(table.items()))


def reclaimable(
    table: Mapping[int, Holder], *, alive: Callable[[Holder], bool], in_use: Callable[[], set[int]]
) -> set[int]:
    """The leases to take back (pure but for the callbacks): those whose holder is gone and whose
    uid no process runs as. `in_use` (a scan of every process) is called only if a holder is gone."""
    orphaned = {uid for uid, holder in table.items() if not alive(holder)}
    return orphaned - in_use() if orphaned else set()


def pick(
    table: Mapping[int, Holder], base: int, count: int, randbelow: Callable[[int], int] = secrets.randbelow
) -> int | None:
    """A uid of the range no lease holds, at random (so a host's gateways rarely contend for
    one); None when every one is held."""
    held = sum(1 for uid in table if base <= uid < base + count)
    if held >= count:
        return None
    while True:
        uid = base + randbelow(count)
        if uid not in table:
            return uid


class UidLeases:
    """This gateway's view of the host's uid leases, for its range."""

    def __init__(self, directory: Path, base: int, count: int, *, gateway: str) -> None:
        self.base = base
        self.count = count
        self._directory = directory
        self._me = Holder(gateway, os.getpid(), _start_time(os.getpid()) or 0)

    def acquire(self) -> int:
        """Lease a uid no live sandbox on the host has; ResourceExhaustedError naming the key
        when the range has none left."""
        with self._table() as table:
            for orphan in reclaimable(table, alive=_alive, in_use=_uids_in_use):
                del table[orphan]
            uid = pick(table, self.base, self.count)
            if uid is None:
                raise ResourceExhaustedError(
                    f"local.sandbox_uid_count: all {self.count} sandbox uids from {self.base} are in use on this host"
                    " (by this gateway and any other sharing local.sandbox_dir)"
                )
            table[uid] = self._me
            return uid

    def release(self, uid: int) -> None:
        """Give back a uid this gateway leased (idempotent; another holder's lease is left)."""
        with self._table() as table:
            if table.get(uid) == self._me:
                del table[uid]

    @contextlib.contextmanager
    def _table(self) -> Iterator[dict[int, Holder]]:
        """The table, under the host-wide lock; written back (whole, atomically) if changed."""
        self._directory.mkdir(mode=0o711, parents=True, exist_ok=True)
        path = self._directory / TABLE
        lock = os.open(path.with_name(TABLE + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                before = parse(path.read_text())
            except FileNotFoundError:
                before = {}
            table = dict(before)
            yield table
            if table != before:
                partial = path.with_name(f"{TABLE}.{os.getpid()}.tmp")
                partial.write_text(render(table))
                partial.replace(path)
        finally:
            os.close(lock)  # and with it the lock


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces); None when
    the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(holder: Holder) -> bool:
    return _start_time(holder.pid) == holder.started


def _uids_in_use() -> set[int]:
    """Every uid (real, effective, saved, filesystem) a process on the host runs as."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                for line in Path(entry.path, "status").read_text().splitlines():
                    if line.startswith("Uid:"):
                        found.update(int(value) for value in line.split()[1:])
                        break
    return found
