"""What this folder's tree comparisons share: `--tree NAME=DIR` options, and runs that alternate
the trees round by round, so that the drift of a shared machine's load falls on each alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def add_tree_option(parser: argparse.ArgumentParser) -> None:
    """`--tree NAME=DIR`, repeated: the trees to compare, the first the base."""
    parser.add_argument(
        "--tree", action="append", required=True, metavar="NAME=DIR", help="a tree's src/ (first: the base)"
    )


def trees(options: list[str]) -> dict[str, str]:
    """NAME -> DIR, in the order given."""
    return dict(option.split("=", 1) for option in options)


def alternate(named: dict[str, str], rounds: int, run: Callable[[str, Path, int], T]) -> dict[str, list[T]]:
    """`run(name, src, round)` for every tree in every round, trees in turn; each tree's results in order."""
    runs: dict[str, list[T]] = {name: [] for name in named}
    for round_ in range(rounds):
        for name, src in named.items():
            print(f"round {round_}: {name}", flush=True)
            runs[name].append(run(name, Path(src).resolve(), round_))
    return runs
