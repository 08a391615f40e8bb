"""`rootfs.Root` on a plain directory standing in for a sandbox's root, with a file outside it
that every generated path tries to reach (through `..`, absolute and relative symlinks planted
inside, links to the host's /): nothing outside the root is ever read, listed, created or
removed. The real sandbox cases are in tests/integration/drivers_local/test_files.py."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warmshell.sandboxio.rootfs import Root

OUTSIDE = b"OUTSIDE THE ROOT"
# Every name in the root (the host's / has others: usr, proc, ...; the outside dir has "outside").
INSIDE_NAMES = {"workspace", "etc", "f", "abs", "rel", "up", "hostroot", "loop"}
PARTS = ["workspace", "etc", "..", ".", "abs", "rel", "up", "hostroot", "secret", "f", "new", "loop"]


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Root]]:
    base = tmp_path_factory.mktemp("rootfs")
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(OUTSIDE)
    root = base / "root"
    (root / "workspace").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "f").write_bytes(b"inside etc")
    (root / "workspace" / "f").write_bytes(b"inside workspace")
    os.symlink(outside / "secret", root / "workspace" / "abs")
    os.symlink("../../outside/secret", root / "workspace" / "rel")
    os.symlink("../../../../../../..", root / "workspace" / "up")
    os.symlink("/", root / "workspace" / "hostroot")
    os.symlink("loop", root / "workspace" / "loop")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    yield root, outside, Root(fd)
    os.close(fd)


def _snapshot(directory: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in directory.rglob("*"))


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.lists(st.sampled_from(PARTS), min_size=1, max_size=8))
def test_no_path_reaches_outside_the_root(layout: tuple[Path, Path, Root], parts: list[str]) -> None:
    root_dir, outside, root = layout
    path = "/" + "/".join(parts)
    before = _snapshot(outside)
    with contextlib.suppress(OSError):
        fd, _ = root.open_read(path)
        try:
            assert os.read(fd, 1 << 16) in (b"inside etc", b"inside workspace"), path
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        names = {e.name for e in root.list(path, 1000)}
        assert names <= INSIDE_NAMES, (path, names)
    with contextlib.suppress(OSError):
        pending = root.begin_write(path, 0o600, make_parents=False)
        root.abort(pending)
    with contextlib.suppress(OSError):
        root.stat(path)
    assert _snapshot(outside) == before, path
    assert not list(root_dir.rglob(".*warmshell-*")), "a temporary file was left behind"


def test_links_resolve_inside(layout: tuple[Path, Path, Root]) -> None:
    _, _, root = layout
    for path in ("/workspace/abs", "/workspace/rel", "/workspace/up/outside/secret"):
        with pytest.raises(FileNotFoundError):
            root.open_read(path)
    fd, size = root.open_read("/workspace/up/etc/f")  # `..` above the root stays at the root
    try:
        assert (os.read(fd, 100), size) == (b"inside etc", 10)
    finally:
        os.close(fd)
    assert {e.name for e in root.list("/workspace/hostroot", 100)} == {"workspace", "etc"}
    with pytest.raises(OSError, match="Too many levels"):
        root.open_read("/workspace/loop")
