"""The FileService against a workload that races it: while the client reads, writes, lists,
stats, removes and makes directories under `/workspace/d`, the workload swaps `d` (atomically,
renameat2 RENAME_EXCHANGE) between a real directory and a symlink to a host directory, and
`d/f` between a regular file, a symlink to a host file, and a FIFO, as fast as it can.

A check-then-open resolver loses this race sooner or later (the symlink swapped in between the
check and the open). What must hold however the race falls: no byte of the host file comes
back, nothing is written or removed on the host, no operation hangs on the FIFO, and every
failure is a clear status (never INTERNAL or UNKNOWN). `test_files_api.py` covers the same
paths without a race."""

from __future__ import annotations

import asyncio
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import Attempts, sandbox, still_real, wait_for
from tests.integration.security.test_files_api import NAME, Files

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr"),
    pytest.mark.timeout(180),
]

RACE_SECONDS = 6.0
OP_TIMEOUT_SECONDS = 10.0

# The workload: sets up /workspace, then exchanges the names as fast as it can.
RACER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
def exchange(a, b):
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2 " + a)
host_dir, seconds = sys.argv[1], float(sys.argv[2])
os.chdir("/workspace")
os.mkdir("d")
with open("d/f", "w") as f:
    f.write("inside")
os.symlink(host_dir + "/f", "d/f-link")
os.mkfifo("d/f-fifo")
os.symlink(host_dir, "d-link")
print("ready", flush=True)
end, swaps = time.monotonic() + seconds, 0
while time.monotonic() < end:
    exchange("d", "d-link")      # d: the symlink to the host directory
    exchange("d-link", "d")      # d: the directory again
    exchange("d/f", "d/f-link")  # d/f: a symlink to the host file
    exchange("d/f", "d/f-fifo")  # d/f: a FIFO
    exchange("d/f", "d/f-link")  # d/f: the regular file
    exchange("d/f-link", "d/f-fifo")
    swaps += 1
print("swaps", swaps, flush=True)
"""


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state") as running:
        await sandbox(running, NAME)
        yield running


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


async def test_swaps_during_file_calls_reach_nothing_outside(gw: RunningGateway, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    secret = f"HOST-SECRET-{secrets.token_hex(8)}".encode()
    (host / "f").write_bytes(secret)
    (host / "new").mkdir()
    (host / "new" / "keep").write_bytes(b"keep")
    host.chmod(0o777)  # as open as it gets: only the resolver stands between the workload and it
    before = _snapshot(host)
    files = Files(gw)

    racer = asyncio.create_task(gw.exec(NAME, ["python3", "-c", RACER, str(host), str(RACE_SECONDS)]))
    await wait_for(lambda: files.stat("/workspace/d-link"))

    calls = Attempts(timeout=OP_TIMEOUT_SECONDS)

    loop = asyncio.get_running_loop()
    end = loop.time() + RACE_SECONDS - 1
    while loop.time() < end and not racer.done():
        await asyncio.gather(
            calls.attempt("read", files.read("/workspace/d/f")),
            calls.attempt("write", files.write("/workspace/d/new/pwned", b"pwned", make_parents=True)),
            calls.attempt("overwrite", files.write("/workspace/d/f", b"pwned")),
            calls.attempt("stat", files.stat("/workspace/d/f")),
            calls.attempt("list", files.list("/workspace/d")),
            calls.attempt("mkdir", files.mkdir("/workspace/d/made", parents=True)),
            calls.attempt("remove", files.remove("/workspace/d/new", recursive=True)),
        )
    code, out, err = await racer
    assert code == 0, err
    assert int(out.split()[-1]) > 100, f"the race hardly ran: {out!r}"

    assert not calls.unclear, calls.unclear
    read_back = set(calls.results["read"])
    assert secret not in b"".join(read_back)  # type: ignore[arg-type]
    assert read_back <= {b"inside", b"pwned", b""}, read_back
    assert _snapshot(host) == before, "the host directory changed"
    # The race was real: some calls met a directory and a file, others the swapped-in names.
    assert calls.outcomes["read:OK"] > 0, calls.outcomes
    assert calls.failures() > 0, calls.outcomes
    await still_real(gw, NAME)
