"""`sandboxio.archive` on a plain directory standing in for a sandbox's root: generated hostile
tars (`..`, absolute names, links out and entries written through them, links over directories,
hard links, device nodes and FIFOs) never change anything outside the destination, and what is
packed comes back the same. The real sandbox cases are in tests/integration/security."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.tars import tar_of
from warmshell.core.archives import ArchiveLimits, EntryRefused
from warmshell.sandboxio.archive import ChunkPipe, pack, unpack
from warmshell.sandboxio.rootfs import Root

LIMITS = ArchiveLimits(max_entries=1000, max_bytes=10 * 1024 * 1024)
NAME_PARTS = st.sampled_from(["a", "b", "..", ".", "", "out", "link"])
NAMES = st.lists(NAME_PARTS, min_size=1, max_size=4).map("/".join)
KINDS = st.sampled_from(
    [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE]
)
TARGETS = st.sampled_from(["..", "../..", "/", "/etc", "a", "../out", "b/../../..", "."])
ENTRIES = st.lists(st.tuples(NAMES, KINDS, TARGETS), min_size=1, max_size=8)


def snapshot(top: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry under `top` with its type and (files, links) content."""
    seen = {}
    for directory, dirs, names in os.walk(top):
        for name in dirs + names:
            path = Path(directory, name)
            st_ = path.lstat()
            content = path.read_bytes() if stat.S_ISREG(st_.st_mode) else b""
            if stat.S_ISLNK(st_.st_mode):
                content = os.readlink(path).encode()
            seen[str(path.relative_to(top))] = (stat.S_IFMT(st_.st_mode), content)
    return seen


@contextlib.contextmanager
def opened(root: Path) -> Iterator[Root]:
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        yield Root(fd)
    finally:
        os.close(fd)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """base/outside (never to change) and base/root/dest with a planted link out and one to /."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"OUTSIDE")
    dest = tmp_path / "root" / "dest"
    dest.mkdir(parents=True)
    (tmp_path / "root" / "keep").write_bytes(b"KEEP")
    os.symlink("../../outside", dest / "out")
    os.symlink("/", dest / "hostroot")
    return tmp_path, dest


def feed(data: bytes, piece: int = 700) -> ChunkPipe:
    """A pipe fed in pieces from an event loop in another thread, as the gateway feeds it."""
    pipe = ChunkPipe(max_bytes=4096)

    async def send_all() -> None:
        for start in range(0, len(data), piece):
            if not await pipe.send(data[start : start + piece]):
                return
        pipe.finish()

    threading.Thread(target=asyncio.run, args=(send_all(),), daemon=True).start()
    return pipe


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=ENTRIES)
def test_hostile_entries_never_change_anything_outside_the_destination(
    layout: tuple[Path, Path], entries: list[tuple[str, bytes, str]]
) -> None:
    base, dest = layout
    outside_before = snapshot(base / "outside")
    with opened(base / "root") as root, contextlib.suppress(EntryRefused, OSError):
        unpack(root, "/dest", feed(tar_of(entries)), LIMITS)
    assert snapshot(base / "outside") == outside_before
    assert (base / "root" / "keep").read_bytes() == b"KEEP"
    assert sorted(os.listdir(base / "root")) == ["dest", "keep"]
    for path in dest.rglob("*"):
        st_ = path.lstat()
        assert stat.S_ISREG(st_.st_mode) or stat.S_ISDIR(st_.st_mode) or stat.S_ISLNK(st_.st_mode), path
        if stat.S_ISLNK(st_.st_mode) and path.name not in ("out", "hostroot"):
            lexical = os.path.normpath(os.path.join(path.parent.relative_to(dest), os.readlink(path)))
            assert not lexical.startswith(("..", "/")), (path, os.readlink(path))


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        (("../escape", tarfile.REGTYPE, ""), "'..'"),
        (("/abs", tarfile.REGTYPE, ""), "absolute"),
        (("l", tarfile.SYMTYPE, "../../outside"), "leads out"),
        (("l", tarfile.SYMTYPE, "/etc/passwd"), "leads out"),
        (("h", tarfile.LNKTYPE, "keep"), "hard link"),
        (("dev", tarfile.CHRTYPE, ""), "device node"),
        (("fifo", tarfile.FIFOTYPE, ""), "FIFO"),
    ],
)
def test_each_refusal_names_its_rule(layout: tuple[Path, Path], entry: tuple[str, bytes, str], rule: str) -> None:
    base, _ = layout
    with opened(base / "root") as root, pytest.raises(EntryRefused, match=rule):
        unpack(root, "/dest", feed(tar_of([entry])), LIMITS)


def test_writing_through_a_planted_link_is_refused(layout: tuple[Path, Path]) -> None:
    """`out` is a link (to outside the root) the workload planted: an entry below it is never
    written through it, and an entry named by it replaces the link, not its target."""
    base, dest = layout
    with opened(base / "root") as root:
        with pytest.raises(OSError, match="out/secret") as info:
            unpack(root, "/dest", feed(tar_of([("out/secret", tarfile.REGTYPE, "")])), LIMITS)
        assert info.value.errno == 40  # ELOOP: the link is not followed
        unpack(root, "/dest", feed(tar_of([("out", tarfile.REGTYPE, "")])), LIMITS)
    assert (base / "outside" / "secret").read_bytes() == b"OUTSIDE"
    assert (dest / "out").read_bytes() == b"PLANTED"
    assert not (dest / "out").is_symlink()


def test_limits_on_entries_bytes_and_headers(layout: tuple[Path, Path]) -> None:
    base, _ = layout
    many = [(f"f{i}", tarfile.REGTYPE, "") for i in range(5)]
    with opened(base / "root") as root:
        with pytest.raises(OSError, match="more than 4 entries"):
            unpack(root, "/dest", feed(tar_of(many)), ArchiveLimits(max_entries=4, max_bytes=1000))
        with pytest.raises(OSError, match="more than 20 bytes"):
            unpack(root, "/dest", feed(tar_of(many)), ArchiveLimits(max_entries=10, max_bytes=20))
        with pytest.raises(EntryRefused, match="extended header"):
            unpack(root, "/dest", feed(tar_of([("x" * 100_000, tarfile.REGTYPE, "")])), LIMITS)
        with pytest.raises(EntryRefused, match="not a tar archive"):
            unpack(root, "/dest", feed(b"\x01" * 2048), LIMITS)


def test_pack_round_trip_keeps_modes_links_mtimes_and_skips_special_files(tmp_path: Path) -> None:
    source = tmp_path / "root" / "src"
    (source / "d").mkdir(parents=True)
    (source / "d" / "x").write_bytes(os.urandom(300_000))
    (source / "d" / "x").chmod(0o741)
    os.utime(source / "d" / "x", (1_000_000_000, 1_000_000_000))
    os.symlink("d/x", source / "l")
    os.symlink("/etc/passwd", source / "abs")  # packed as a link, never followed
    os.mkfifo(source / "fifo")
    with opened(tmp_path / "root") as root:
        data = b"".join(pack(root, "/src", LIMITS, 64 * 1024))
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            assert archive.getnames() == ["abs", "d", "d/x", "l"]
        # Back in through unpack (the absolute link refused there), the rest lands intact.
        without = b"".join(pack(root, "/src/d", LIMITS, 1000))
        unpack(root, "/copy", feed(without), LIMITS)
    copy = tmp_path / "root" / "copy" / "x"
    assert copy.read_bytes() == (source / "d" / "x").read_bytes()
    assert (copy.stat().st_mode & 0o777, int(copy.stat().st_mtime)) == (0o741, 1_000_000_000)


def test_pack_refuses_beyond_its_limits(tmp_path: Path) -> None:
    (tmp_path / "root" / "src").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "root" / "src" / f"f{i}").write_bytes(b"12345")
    with opened(tmp_path / "root") as root:
        with pytest.raises(OSError, match="more than 2 entries"):
            b"".join(pack(root, "/src", ArchiveLimits(2, 100), 512))
        with pytest.raises(OSError, match="more than 12 bytes"):
            b"".join(pack(root, "/src", ArchiveLimits(10, 12), 512))
