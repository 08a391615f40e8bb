"""Issue 31: could a fork's layer be a farm of hard links (or the parent's own files, moved) within
the parent's tmpfs instead of a copy, safely? A parent's write after the snapshot must not change
what its children see.

    python bench/investigations/fork-copy/link_farm.py [--files 10000]

On /dev/shm (a tmpfs, as a sandbox's /workspace and upper layer are), each way a parent keeps
writing is tried against two no-copy layers, and whether the "layer" changed is recorded:

- `link`: the layer is a hard link of each of the parent's files (the parent keeps its names);
- `move`: the parent's files are renamed into the layer and the parent gets fresh copies under
  its names (what "the parent's files become the layer, the parent gets copies-up" would do);

the parent's writes: an in-place write through its name, an `O_TRUNC` rewrite, an editor's save
(a new file renamed over the name), and a write through a descriptor (an `O_APPEND` log, a
`MAP_SHARED` mapping) opened before the snapshot and kept. Then the cost that made it tempting:
a farm of `--files` empty-ish files linked against the same files copied.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness

from harness import write_results

_ORIGINAL = b"original content\n"


def _in_place(path: Path, kept: dict[str, Any]) -> None:
    with path.open("r+b") as f:
        f.write(b"PARENT")


def _truncate(path: Path, kept: dict[str, Any]) -> None:
    path.write_bytes(b"PARENT rewrote it\n")


def _editor_save(path: Path, kept: dict[str, Any]) -> None:
    new = path.with_suffix(".tmp")
    new.write_bytes(b"PARENT saved it\n")
    os.rename(new, path)


def _open_log(path: Path, kept: dict[str, Any]) -> None:
    os.write(kept["log"], b"PARENT appended\n")


def _open_mapping(path: Path, kept: dict[str, Any]) -> None:
    kept["map"][0:6] = b"PARENT"
    kept["map"].flush()


WRITES: dict[str, Callable[[Path, dict[str, Any]], None]] = {
    "in-place write through its name": _in_place,
    "O_TRUNC rewrite": _truncate,
    "editor's save (rename over)": _editor_save,
    "O_APPEND descriptor opened before": _open_log,
    "MAP_SHARED mapping made before": _open_mapping,
}


def trial(scheme: str, how: Callable[[Path, dict[str, Any]], None], root: Path) -> bool:
    """Whether the layer's file changed when the parent wrote `how` after a `scheme` snapshot."""
    parent, layer = root / "parent", root / "layer"
    parent.mkdir()
    layer.mkdir()
    name = parent / "file"
    name.write_bytes(_ORIGINAL)
    descriptor = os.open(name, os.O_RDWR | os.O_APPEND)
    kept: dict[str, Any] = {"log": descriptor, "map": mmap.mmap(descriptor, len(_ORIGINAL))}
    try:
        if scheme == "link":
            os.link(name, layer / "file")
        else:  # move: the layer takes the inode, the parent a fresh copy under its name
            os.rename(name, layer / "file")
            shutil.copy2(layer / "file", name)
        how(name, kept)
        return (layer / "file").read_bytes() != _ORIGINAL
    finally:
        kept["map"].close()
        os.close(descriptor)
        shutil.rmtree(parent)
        shutil.rmtree(layer)


def farm_cost(root: Path, files: int) -> dict[str, float]:
    """ms to link `files` small files into a farm, and to copy them, within one tmpfs."""
    source = root / "tree"
    source.mkdir()
    for n in range(files):
        (source / f"f{n}").write_bytes(b"x" * 100)
    took: dict[str, float] = {}
    for kind, op in (("link_ms", os.link), ("copy_ms", shutil.copyfile)):
        target = root / kind
        target.mkdir()
        started = time.perf_counter()
        for n in range(files):
            op(source / f"f{n}", target / f"f{n}")
        took[kind] = (time.perf_counter() - started) * 1000
        shutil.rmtree(target)
    shutil.rmtree(source)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        root = Path(shm)
        changed = {
            f"{scheme}: {what}": trial(scheme, how, root) for scheme in ("link", "move") for what, how in WRITES.items()
        }
        cost = farm_cost(root, args.files)
    lines = ["| no-copy layer: the parent's write after the snapshot | the children's layer changed |", "|---|---|"]
    lines += [f"| {key} | {'**yes**' if value else 'no'} |" for key, value in changed.items()]
    lines += [
        "",
        f"{args.files} files of 100 bytes within one tmpfs: linked in {cost['link_ms']:.1f} ms, "
        f"copied in {cost['copy_ms']:.1f} ms (Python's loop over both).",
    ]
    write_results("link_farm", {"changed": changed, **cost}, "\n".join(lines))


if __name__ == "__main__":
    main()
