"""Attacks through the bulk file calls (UploadTar, DownloadTar) on a real local sandbox: hostile
tar entries from the client, a link the workload planted for an upload to write through, and a
workload swapping directories, files, links and FIFOs while archives go in and out.

What must hold: every hostile entry is refused with INVALID_ARGUMENT naming the entry and the
rule; nothing outside the sandbox is read or written whatever the race; no call hangs on a FIFO;
every failure is a clear status (never INTERNAL or UNKNOWN)."""

from __future__ import annotations

import asyncio
import io
import secrets
import shutil
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.tars import tar_of
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import Attempts, sandbox, sh, still_real, wait_for
from tests.integration.security.test_files_api import NAME
from tests.integration.security.test_files_races import RACE_SECONDS, RACER, _snapshot
from warmshell.sdk.files import AsyncFiles

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr"),
    pytest.mark.timeout(180),
]


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state") as running:
        await sandbox(running, NAME)
        yield running


HOSTILE = [
    ((("../../etc/pwned", tarfile.REGTYPE, ""),), "'..' component"),
    ((("/etc/pwned", tarfile.REGTYPE, ""),), "absolute name"),
    ((("esc", tarfile.SYMTYPE, "../../../etc"), ("esc/pwned", tarfile.REGTYPE, "")), "leads out"),
    ((("abs", tarfile.SYMTYPE, "/etc"),), "leads out"),
    ((("hard", tarfile.LNKTYPE, "/etc/passwd"),), "hard link"),
    ((("null", tarfile.CHRTYPE, ""),), "device node"),
    ((("fifo", tarfile.FIFOTYPE, ""),), "FIFO"),
]


@pytest.mark.parametrize(("entries", "rule"), HOSTILE, ids=[rule for _, rule in HOSTILE])
async def test_hostile_entries_are_refused_naming_the_rule(
    gw: RunningGateway, entries: tuple[tuple[str, bytes, str], ...], rule: str
) -> None:
    files = AsyncFiles(gw.channel, NAME, metadata=gw.metadata)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await files.upload_tar(io.BytesIO(tar_of(entries, b"pwned")), "/workspace/up")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert rule in (info.value.details() or ""), info.value.details()
    _code, out, _ = await sh(gw, NAME, "ls -A /etc | grep -c pwned; find /workspace -name pwned | wc -l")
    assert out.split() == ["0", "0"], out
    await still_real(gw, NAME)


async def test_a_planted_link_is_never_written_through(gw: RunningGateway, tmp_path: Path) -> None:
    """The workload links /workspace/up/out to /etc (and to a host path): an upload's entry below
    `out` is refused, one named `out` replaces the link itself."""
    files = AsyncFiles(gw.channel, NAME, metadata=gw.metadata)
    host = tmp_path / "host"
    host.mkdir(mode=0o777)
    assert (
        await sh(gw, NAME, f"mkdir -p /workspace/up && ln -s /etc /workspace/up/out && ln -s {host} /workspace/up/h")
    )[0] == 0
    for name in ("out/pwned", "h/pwned"):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await files.upload_tar(io.BytesIO(tar_of([(name, tarfile.REGTYPE, "")], b"pwned")), "/workspace/up")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value.details()
        assert "symbolic link" in (info.value.details() or "")
    assert not list(host.iterdir())
    await files.upload_tar(io.BytesIO(tar_of([("out", tarfile.REGTYPE, "")], b"pwned")), "/workspace/up")
    assert await files.read("/workspace/up/out") == b"pwned"
    assert (await sh(gw, NAME, "test -e /etc/pwned || echo absent"))[1] == "absent\n"


async def test_swaps_during_bulk_calls_reach_nothing_outside(gw: RunningGateway, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    secret = f"HOST-SECRET-{secrets.token_hex(8)}".encode()
    (host / "f").write_bytes(secret)
    (host / "new").mkdir()
    host.chmod(0o777)
    before = _snapshot(host)
    files = AsyncFiles(gw.channel, NAME, metadata=gw.metadata)
    racer = asyncio.create_task(gw.exec(NAME, ["python3", "-c", RACER, str(host), str(RACE_SECONDS)]))
    await wait_for(lambda: files.stat("/workspace/d-link"))
    calls = Attempts(timeout=10)
    upload = tar_of([("d/f", tarfile.REGTYPE, ""), ("d/new/pwned", tarfile.REGTYPE, "")], b"pwned")

    async def download(path: str) -> bytes:
        return b"".join([chunk async for chunk in files.download_tar(path)])

    loop = asyncio.get_running_loop()
    end = loop.time() + RACE_SECONDS - 1
    while loop.time() < end and not racer.done():
        await asyncio.gather(
            calls.attempt("upload", files.upload_tar(io.BytesIO(upload), "/workspace")),
            calls.attempt("upload-below", files.upload_tar(io.BytesIO(upload), "/workspace/d")),
            calls.attempt("download", download("/workspace/d")),
            calls.attempt("download-all", download("/workspace")),
        )
    code, _out, err = await racer
    assert code == 0, err
    assert not calls.unclear, calls.unclear
    downloaded = [blob for label in ("download", "download-all") for blob in calls.results[label]]
    assert not any(secret in blob for blob in downloaded)  # type: ignore[operator]
    assert _snapshot(host) == before, "the host directory changed"
    # The race was real: some calls met the directory, others the swapped-in names.
    assert calls.outcomes["upload:OK"] > 0, calls.outcomes
    assert calls.outcomes["download:OK"] > 0, calls.outcomes
    assert calls.failures() > 0, calls.outcomes
    await still_real(gw, NAME)
