"""`core.archives`: which tar entry names and link targets may land below a destination,
checked against a resolution done the long way (component by component) over generated paths."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.archives import EntryRefused, entry_path, link_stays_inside, regroup

PARTS = st.sampled_from(["a", "b", "..", ".", "", "c.txt"])
NAMES = st.lists(PARTS, min_size=1, max_size=6).map("/".join)


def climbs_out(base: list[str], target: str) -> bool:
    """Resolve `target` from the directory `base` one component at a time."""
    depth = list(base)
    for part in target.split("/"):
        if part == "..":
            if not depth:
                return True
            depth.pop()
        elif part not in ("", "."):
            depth.append(part)
    return False


@pytest.mark.parametrize(("name", "path"), [("./a//b/", "a/b"), (".", ""), ("", ""), ("a/./b", "a/b"), ("x", "x")])
def test_names_normalise_below_the_destination(name: str, path: str) -> None:
    assert entry_path(name) == path


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "a/..", "a\0b", "x" * 5000])
def test_hostile_names_are_refused_naming_the_rule(name: str) -> None:
    with pytest.raises(EntryRefused, match=r"absolute|'\.\.'|NUL|longer"):
        entry_path(name)


@given(NAMES)
def test_an_accepted_name_never_leaves_the_destination(name: str) -> None:
    try:
        path = entry_path(name)
    except EntryRefused:
        assert name.startswith("/") or ".." in name.split("/")
        return
    assert not path.startswith("/")
    assert ".." not in path.split("/")


@given(st.lists(st.sampled_from(["a", "b"]), max_size=3), NAMES, st.booleans())
def test_a_link_is_allowed_exactly_when_it_stays_inside(base: list[str], target: str, absolute: bool) -> None:
    if absolute:
        target = "/" + target
    path = "/".join([*base, "link"])
    expected = bool(target) and not target.startswith("/") and not climbs_out(base, target)
    assert link_stays_inside(path, target) == expected


@given(st.lists(st.binary(max_size=50)), st.integers(min_value=1, max_value=20))
def test_regroup_keeps_the_bytes_in_full_chunks(pieces: list[bytes], size: int) -> None:
    chunks = list(regroup(pieces, size))
    assert b"".join(chunks) == b"".join(pieces)
    assert all(len(chunk) == size for chunk in chunks[:-1])
    assert all(0 < len(chunk) <= size for chunk in chunks)
