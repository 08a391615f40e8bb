"""The tar-entry policy over any entry a hostile layer could hold: nothing is written outside
the layer, no setuid/setgid bit survives, no device node is made."""

from __future__ import annotations

import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.errors import InvalidArgumentError, ResourceExhaustedError
from warmshell.drivers.local.imagestore import entries
from warmshell.drivers.local.imagestore.entries import Entry, Kind

_PARTS = st.sampled_from(["a", "b", "..", ".", "", ".wh.x", ".wh..wh..opq", "etc", "dev", "\x00"])
_NAMES = st.builds(
    lambda lead, parts: lead + "/".join(parts), st.sampled_from(["", "/", "./", "//"]), st.lists(_PARTS, max_size=6)
)
_ENTRIES = st.builds(
    Entry,
    name=_NAMES,
    kind=st.sampled_from(list(Kind)),
    mode=st.integers(0, 0o7777),
    size=st.integers(0, 2**40),
    link=_NAMES,
)


@given(_ENTRIES)
def test_no_entry_is_written_outside_its_layer(entry: Entry) -> None:
    try:
        action = entries.decide(entry, where="layer", max_entry_bytes=2**30)
    except (InvalidArgumentError, ResourceExhaustedError) as exc:
        refused = exc
    else:
        refused = None
    if isinstance(refused, InvalidArgumentError):
        assert refused.field == "layer"
        return
    if refused is not None:
        assert entry.size > 2**30
        assert "local.image_store_size" in str(refused)
        return
    paths = {
        entries.Write: lambda a: [a.path, a.link_path],
        entries.Whiteout: lambda a: [(*a.parent, a.name)],
        entries.Opaque: lambda a: [a.directory],
        entries.Skip: lambda a: [],
    }[type(action)](action)
    for path in paths:
        assert not {"..", "", "."} & set(path)
        assert not any("\x00" in part or "/" in part for part in path)
    if isinstance(action, entries.Write):
        assert action.kind not in (Kind.DEVICE, Kind.FIFO, Kind.OTHER)
        assert not action.mode & (stat.S_ISUID | stat.S_ISGID)
        assert action.size <= 2**30


def test_a_dotdot_entry_refuses_the_layer() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'..'"):
        entries.decide(Entry("a/../../etc/passwd", Kind.FILE), where="l", max_entry_bytes=10)


def test_absolute_paths_are_made_relative() -> None:
    action = entries.decide(Entry("/etc/passwd", Kind.FILE, 0o4755), where="l", max_entry_bytes=10)
    assert action == entries.Write(("etc", "passwd"), Kind.FILE, 0o755)


def test_whiteouts_and_opaque_markers() -> None:
    assert entries.decide(Entry("usr/.wh.lib", Kind.FILE), where="l", max_entry_bytes=1) == entries.Whiteout(
        ("usr",), "lib"
    )
    assert entries.decide(Entry("usr/.wh..wh..opq", Kind.FILE), where="l", max_entry_bytes=1) == entries.Opaque(
        ("usr",)
    )


def test_devices_are_skipped_and_hard_links_stay_in_the_layer() -> None:
    assert isinstance(entries.decide(Entry("dev/sda", Kind.DEVICE), where="l", max_entry_bytes=1), entries.Skip)
    with pytest.raises(InvalidArgumentError, match=r"'..'"):
        entries.decide(Entry("x", Kind.HARDLINK, link="../../etc/shadow"), where="l", max_entry_bytes=1)


def test_a_file_over_the_budget_refuses_the_layer() -> None:
    with pytest.raises(ResourceExhaustedError, match=r"more than the 100 left under local.image_store_size"):
        entries.decide(Entry("big", Kind.FILE, size=101), where="l", max_entry_bytes=100)


@given(_NAMES)
def test_a_path_is_its_names_without_empty_or_dot_components(name: str) -> None:
    try:
        path = entries.normalise(name, where="layer")
    except InvalidArgumentError:
        assert "\x00" in name or ".." in name.split("/")
        return
    assert path == tuple(p for p in name.split("/") if p not in ("", "."))
