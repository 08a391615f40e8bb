"""A layer's files and directories get exactly the modes their entries state (less setuid and
setgid, plus the owner's read and write), whatever the process's umask and whether or not the
write skipped the `chmod` (see `extracting.created_mode_mask`)."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.images import Layer
from warmshell.drivers.local.imagestore.extracting import (
    BoundedReader,
    Limits,
    created_mode_mask,
    exact_on_create,
    extract_layer,
)

_MODES = st.integers(0, 0o7777)


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _extract(layer: Layer, dest: Path) -> None:
    data = layer.tar()
    reader = BoundedReader(io.BytesIO(data), limit=len(data), key="k", where="layer")
    extract_layer(reader, dest, where="layer", limits=Limits(budget=1 << 20))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    umask=st.sampled_from([0o000, 0o002, 0o022, 0o077]),
    files=st.lists(_MODES, min_size=1, max_size=4),
    dirs=st.lists(_MODES, min_size=1, max_size=4),
    setgid_root=st.booleans(),
)
def test_modes_are_as_stated_whatever_the_umask(
    tmp_path_factory: pytest.TempPathFactory, umask: int, files: list[int], dirs: list[int], setgid_root: bool
) -> None:
    parent = tmp_path_factory.mktemp("modes")
    if setgid_root:
        parent.chmod(0o2755)
    layer = Layer()
    for number, mode in enumerate(dirs):
        layer.directory(f"d{number}", mode).file(f"d{number}/inside", b"x")
    for number, mode in enumerate(files):
        layer.file(f"f{number}", b"data" * number, mode)
    dest = parent / "layer"
    with _umask(umask):
        _extract(layer, dest)
    keep = 0o7777 & ~(stat.S_ISUID | stat.S_ISGID)
    for number, mode in enumerate(dirs):
        assert oct(_mode(dest / f"d{number}")) == oct(mode & keep | 0o700)
    for number, mode in enumerate(files):
        assert oct(_mode(dest / f"f{number}")) == oct(mode & keep | 0o600)
        assert (dest / f"f{number}").read_bytes() == b"data" * number


def test_the_umask_is_the_created_mode_mask_under_a_plain_directory(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with _umask(0o027):
            assert created_mode_mask(fd) == 0o027
        tmp_path.chmod(0o2755)  # its new directories would be setgid: every mode is set by chmod
        assert created_mode_mask(fd) is None
    finally:
        os.close(fd)


@given(mode=_MODES, umask=st.integers(0, 0o777))
def test_a_mode_is_exact_on_create_only_when_the_umask_takes_nothing_off(mode: int, umask: int) -> None:
    created = mode & ~umask & 0o777
    assert exact_on_create(mode, umask) == (created == mode)
    assert not exact_on_create(mode, None)
