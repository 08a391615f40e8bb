"""Reads warm-pool profiles from `local.pools_dir` and reloads them when files change.

Polls the directory's listing (name, mtime, size, inode), and of the other files given (the image
store's index: a re-import that points a profile's tag elsewhere is a change of that profile),
every `pool_reload_interval_seconds`:
cheap, portable, and no inotify dependency. Any change re-reads every `*.toml` file, which keeps
the code simple for directories of a few dozen profiles. A directory that does not exist holds no
profiles (it is logged, not fatal).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from warmshell.core.profiles import Profile, ProfileError, parse_profile

__all__ = ["load", "snapshot", "watch"]

_log = logging.getLogger(__name__)

Snapshot = frozenset[tuple[str, int, int, int]]
Apply = Callable[[Mapping[str, Profile], Mapping[str, ProfileError]], None]


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.toml") if not p.name.startswith("."))


def snapshot(directory: Path, also: Sequence[Path] = ()) -> Snapshot:
    """What identifies the directory's current content, and that of the files `also` names
    (blocking)."""
    entries = set()
    for path in [*_files(directory), *also]:
        try:
            info = path.stat()
        except OSError:
            continue  # removed while listing; the next poll sees the final state
        entries.add((str(path), info.st_mtime_ns, info.st_size, info.st_ino))
    return frozenset(entries)


def load(directory: Path, *, max_replicas: int) -> tuple[dict[str, Profile], dict[str, ProfileError]]:
    """Every profile in the directory, and the errors of those that are invalid (blocking)."""
    profiles: dict[str, Profile] = {}
    errors: dict[str, ProfileError] = {}
    for path in _files(directory):
        try:
            text = path.read_text()
            profile = parse_profile(text, name=path.stem, source=str(path), max_replicas=max_replicas)
            profiles[path.stem] = _with_copy_sources(profile, directory)
        except ProfileError as exc:
            errors[path.stem] = exc
        except (OSError, UnicodeDecodeError) as exc:
            errors[path.stem] = ProfileError(str(path), "(file)", f"cannot read: {exc}")
    return profiles, errors


def _with_copy_sources(profile: Profile, directory: Path) -> Profile:
    """The profile with its `[setup]` copies' sources made absolute (relative ones are the
    profile directory's); ProfileError naming `setup.copy` for one that does not exist."""
    if profile.setup is None or not profile.setup.copies:
        return profile
    copies = []
    digest = hashlib.sha256()
    for local, path in profile.setup.copies:
        source = (directory / local).absolute()
        if not source.exists():
            raise ProfileError(profile.source, "setup.copy", f"{local!r} (from {str(source)!r}) does not exist")
        copies.append((str(source), path))
        for file in sorted([source] if source.is_file() else (p for p in source.rglob("*") if p.is_file())):
            digest.update(f"{file.relative_to(source.parent)}\0".encode())
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    setup = dataclasses.replace(profile.setup, copies=tuple(copies), copied=digest.hexdigest())
    return dataclasses.replace(profile, setup=setup)


async def watch(
    directory: Path, *, interval: float, max_replicas: int, apply: Apply, also: Sequence[Path] = ()
) -> None:
    """Apply the directory's profiles now and after every change (or one of the files `also`
    names), until cancelled."""
    if not await asyncio.to_thread(directory.is_dir):
        _log.warning("warm pools: %s is not a directory; no pools until it appears", directory)
    last: Snapshot | None = None
    while True:
        try:
            current = await asyncio.to_thread(snapshot, directory, also)
            if current != last:
                profiles, errors = await asyncio.to_thread(load, directory, max_replicas=max_replicas)
                apply(profiles, errors)
                last = current
        except Exception:
            # A bug here must not stop reloading for good; the next poll tries again.
            _log.exception("warm pools: reloading %s failed", directory)
        await asyncio.sleep(interval)
