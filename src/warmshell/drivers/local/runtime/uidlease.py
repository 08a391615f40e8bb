"""Host uids for sandboxes when the gateway runs as root: no two live sandboxes on a host share
one, whichever gateway made them.

Every root gateway on a host draws from `local.sandbox_uid_base` / `local.sandbox_uid_count`
(the same default range), and a shared uid shares every per-uid kernel account: RLIMIT_NPROC
counts the host uid across namespaces and gateways, so a fork bomb in one gateway's sandbox made
every exec in another's fail. So the leases live in the runtime directory (`runtimedir`: a
tmpfs named for `local.sandbox_dir`), which the gateways of a host that share a sandbox directory
share: `<runtime>/uid-leases/<uid>`, a file naming its holder (the gateway's name,
its pid and that pid's start time), linked into place (two gateways cannot both make it) and
removed when the sandbox has ended. A file per lease rather than one table: rewriting a table
and renaming it over the old one cost 3-7 ms per start on ext4 (which flushes a file renamed
over another) at a thousand leases; making or removing a file costs tens of microseconds.

A gateway killed with -9 never gives its leases back: once a range has no free uid, a lease
whose holder is gone is taken back if no process on the host runs as its uid any more
(`/proc/*/status`), i.e. its sandbox has really ended; that takeover happens under an exclusive
`flock` of `<runtime>/uid-leases.lock`, so two gateways never take the same one. Blocking
I/O: callers use a thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.errors import ResourceExhaustedError

__all__ = ["LEASES", "Holder", "UidLeases", "pick", "reclaimable"]

LEASES = "uid-leases"
# Random uids tried with O_EXCL before the range is listed: in a range with free uids, the first
# nearly always succeeds.
_PROBES = 8


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: a gateway (its name on the host) in the process `pid` started at
    `started` (clock ticks since boot, /proc/<pid>/stat: a reused pid is another process)."""

    gateway: str
    pid: int
    started: int

    def render(self) -> str:
        """The lease file's content."""
        return f"{self.gateway} {self.pid} {self.started}\n"

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """A lease file's holder; None for anything else (a file cut short by a crash)."""
        fields = text.split()
        if len(fields) != 3 or not (fields[1].isdigit() and fields[2].isdigit()):
            return None
        return cls(fields[0], int(fields[1]), int(fields[2]))


def pick(
    held: Collection[int], base: int, count: int, randbelow: Callable[[int], int] = secrets.randbelow
) -> int | None:
    """A uid of the range that is not held, at random (so a host's gateways rarely contend for
    one); None when every one is held (pure but for the randomness)."""
    if sum(1 for uid in held if base <= uid < base + count) >= count:
        return None
    while True:
        uid = base + randbelow(count)
        if uid not in held:
            return uid


def reclaimable(
    table: Mapping[int, Holder | None], *, alive: Callable[[Holder], bool], in_use: Callable[[], set[int]]
) -> list[int]:
    """The leases that may be taken back, in uid order: those whose holder is gone (or
    unreadable) and whose uid no process runs as. `alive` is asked once per holder (a host's few
    gateways, not its thousands of leases), `in_use` (a scan of every process) only if one is gone."""
    gone = {holder for holder in set(table.values()) if holder is None or not alive(holder)}
    orphaned = {uid for uid, holder in table.items() if holder in gone}
    return sorted(orphaned - in_use()) if orphaned else []


class UidLeases:
    """This gateway's leases of the host's sandbox uids, from its range."""

    def __init__(self, directory: Path, base: int, count: int, *, gateway: str) -> None:
        self.base = base
        self.count = count
        self._leases = directory / LEASES
        self._me = Holder(gateway, os.getpid(), _start_time(os.getpid()) or 0)

    def acquire(self) -> int:
        """Lease a uid no live sandbox on the host has; ResourceExhaustedError naming the key
        when the range has none left."""
        for _ in range(_PROBES):
            probe = self.base + secrets.randbelow(self.count)
            if self._lease_new(probe):
                return probe
        while (free := pick(self._held(), self.base, self.count)) is not None:
            if self._lease_new(free):  # else another gateway took it meanwhile: list again
                return free
        return self._take_back()

    def release(self, uid: int) -> None:
        """Give back a uid this gateway leased (idempotent; another holder's lease is left)."""
        lease = self._leases / str(uid)
        with contextlib.suppress(FileNotFoundError):
            if Holder.parse(lease.read_text()) == self._me:
                lease.unlink()

    def _lease_new(self, uid: int) -> bool:
        """Make the lease file of a uid nobody holds; False when one exists. Written aside and
        linked into place (link fails if the name exists), so a lease is never seen half-written
        (a takeover would count such a one as a dead holder's)."""
        partial = self._leases / f".new-{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(partial, flags, 0o600)
        except FileNotFoundError:  # made by the first lease (not each: a member start makes one)
            self._leases.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(partial, flags, 0o600)
        try:
            os.write(fd, self._me.render().encode())
        finally:
            os.close(fd)
        try:
            os.link(partial, self._leases / str(uid))
        except FileExistsError:
            return False
        finally:
            partial.unlink()
        return True

    def _held(self) -> set[int]:
        return {int(name) for name in os.listdir(self._leases) if name.isdigit()}

    def _take_back(self) -> int:
        """Under the host-wide lock: the first lease of the range whose holder and processes are
        gone, now this gateway's."""
        with self._locked():
            table = {uid: self._holder(uid) for uid in self._held() if self.base <= uid < self.base + self.count}
            for uid in reclaimable(table, alive=_alive, in_use=_uids_in_use):
                partial = self._leases / f".{uid}.{os.getpid()}"
                partial.write_text(self._me.render())
                partial.replace(self._leases / str(uid))  # atomically: the holder is never unreadable
                return uid
        raise ResourceExhaustedError(
            f"local.sandbox_uid_count: all {self.count} sandbox uids from {self.base} are in use on this host"
            f" (by this gateway and any other sharing its runtime directory {str(self._leases.parent)!r})"
        )

    def _holder(self, uid: int) -> Holder | None:
        try:
            return Holder.parse((self._leases / str(uid)).read_text())
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock = os.open(self._leases.with_name(LEASES + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
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
