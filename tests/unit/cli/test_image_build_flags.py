"""`image build`'s flags: --run and --copy steps keep their command-line order; a --copy that is
not LOCAL:PATH is refused naming the flag."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from warmshell.cli import imagebuild
from warmshell.sdk import building, errors


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    imagebuild.add_flags(parser)
    return parser.parse_args(argv)


def test_steps_keep_the_order_they_were_given_in() -> None:
    args = parse("--from", "b:1", "--run", "a", "--copy", "x:/y", "--run", "b", "--as", "t:1")
    assert args.steps == [("run", "a"), ("copy", "x:/y"), ("run", "b")]
    assert parse("--from", "b:1", "--as", "t:1").steps == []


def test_a_copy_splits_on_its_last_colon_and_needs_an_absolute_path() -> None:
    assert building.parse_copy("C:/dir:/workspace/dir") == building.Copy(Path("C:/dir"), "/workspace/dir")
    for bad in ("nocolon", "local:relative", ":/abs"):
        with pytest.raises(errors.InvalidArgument, match=r"^--copy: "):
            building.parse_copy(bad)
