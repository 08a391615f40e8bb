"""Which argument of `sandbox cp` names the sandbox side (pure)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from warmshell.cli.files import Remote, parse_location


def test_remote_and_local() -> None:
    assert parse_location("box:/workspace/a") == Remote("box", "/workspace/a")
    assert parse_location("box:a/b") == Remote("box", "/workspace/a/b")
    assert parse_location("box:") == Remote("box", "/workspace/")
    assert parse_location("my-box-2:/etc/x") == Remote("my-box-2", "/etc/x")
    for local in ("./box:a", "/tmp/box:a", "file.txt", "Box:a", "-box:a", "box-:a", "a b:c"):
        assert parse_location(local) == Path(local), local


@given(st.text())
def test_every_argument_is_one_or_the_other(argument: str) -> None:
    parsed = parse_location(argument)
    if isinstance(parsed, Remote):
        assert argument.startswith(parsed.name + ":")
        assert parsed.path.startswith("/")
    else:
        assert parsed == Path(argument)
