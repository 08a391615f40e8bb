"""Path normalisation and the error each errno becomes (pure)."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from warmshell.drivers.files import file_error, normalize_path


def test_normalize() -> None:
    assert normalize_path("/") == "/"
    assert normalize_path("//workspace//a/") == "/workspace/a"
    assert normalize_path("/workspace/../../../etc/shadow") == "/etc/shadow"
    assert normalize_path("/a/./b/../c") == "/a/c"
    for bad, rule in (("", "empty"), ("rel", "absolute"), ("/a\0b", "NUL"), ("/" + "a" * 5000, "4096")):
        with pytest.raises(InvalidArgumentError) as info:
            normalize_path(bad)
        assert info.value.field == "path"
        assert rule in info.value.rule


@given(st.lists(st.sampled_from(["..", ".", "a", "b", "", "etc"]), max_size=12))
def test_normalized_paths_are_absolute_and_free_of_dots(parts: list[str]) -> None:
    path = normalize_path("/" + "/".join(parts))
    assert path.startswith("/")
    assert ".." not in path.split("/")
    assert "." not in path.split("/")
    assert "//" not in path


def test_errors_name_the_path_and_the_cause() -> None:
    cases = {
        errno.ENOENT: (NotFoundError, "no such file"),
        errno.EACCES: (PermissionDeniedError, "permission denied"),
        errno.EROFS: (PermissionDeniedError, "read-only"),
        errno.EISDIR: (FailedPreconditionError, "is a directory"),
        errno.ENOTDIR: (FailedPreconditionError, "not a directory"),
        errno.ENOTEMPTY: (FailedPreconditionError, "not empty"),
        errno.EEXIST: (AlreadyExistsError, "already exists"),
        errno.ELOOP: (FailedPreconditionError, "symbolic link"),
        errno.ENOSPC: (ResourceExhaustedError, "no space"),
    }
    for code, (cls, words) in cases.items():
        error = file_error("/workspace/x", OSError(code, "host text", "/proc/4242/root/workspace/x"))
        assert isinstance(error, cls), code
        assert str(error).startswith("/workspace/x: "), error
        assert words in str(error), error
        assert "/proc/4242" not in str(error)  # never the host path
    assert isinstance(file_error("/p", OSError(errno.ENAMETOOLONG, "x")), InvalidArgumentError)
