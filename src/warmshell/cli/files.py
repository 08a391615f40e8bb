"""`warmshell sandbox cp` and `sandbox ls`: files in and out of a sandbox over the FileService
(through the SDK's `Files`), a chunk at a time.

`parse_location` decides, purely, which argument of `cp` names the sandbox side: `NAME:PATH`
where NAME is a sandbox name (a DNS-1123 label), anything else is a local path (`./a:b` is
local). A relative sandbox path is taken from /workspace, where the workload starts.
"""

from __future__ import annotations

import posixpath
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from warmshell.cli.errors import CliError, ExitCode

if TYPE_CHECKING:
    from warmshell.sdk.client import Client
    from warmshell.sdk.files import FileInfo, Files

__all__ = ["Remote", "copy", "copy_tree", "list_files", "listing_table", "parse_location"]

WORKSPACE = "/workspace"
_REMOTE = re.compile(r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?):(.*)$", re.DOTALL)


@dataclass(frozen=True)
class Remote:
    """A path in a sandbox."""

    name: str
    path: str


def parse_location(argument: str) -> Remote | Path:
    """`NAME:PATH` -> Remote (a relative PATH is under /workspace; empty means /workspace), else
    a local Path."""
    match = _REMOTE.match(argument)
    if match is None:
        return Path(argument)
    name, path = match.group(1), match.group(3)
    return Remote(name, posixpath.join(WORKSPACE, path) if not path.startswith("/") else path)


def _local_error(path: Path, exc: OSError) -> CliError:
    code = ExitCode.NOT_FOUND if isinstance(exc, FileNotFoundError) else ExitCode.FAILURE
    return CliError(f"{path}: {exc.strerror or exc}", code)


def _locations(source: str, destination: str) -> tuple[Remote | Path, Remote | Path]:
    src, dst = parse_location(source), parse_location(destination)
    if isinstance(src, Remote) == isinstance(dst, Remote):
        raise CliError(
            "sandbox cp: exactly one of SOURCE and DESTINATION is NAME:PATH (a path in a sandbox)", ExitCode.USAGE
        )
    return src, dst


def copy_tree(client: Client, source: str, destination: str, workspace: str) -> tuple[str, int, int]:
    """`cp -r`: a directory between here and a sandbox in one call (modes, links, mtimes kept);
    like cp -r, into DESTINATION/NAME when DESTINATION is an existing directory (or ends in /),
    else as DESTINATION. (where it went, entries, bytes). A file source is copied as by `copy`."""
    src, dst = _locations(source, destination)
    if isinstance(dst, Remote):
        assert isinstance(src, Path)
        if not src.is_dir():
            where, size = copy(client, source, destination, workspace)
            return where, 1, size
        files = client.files(dst.name, workspace=workspace)
        path = posixpath.join(dst.path, src.resolve().name) if _remote_directory(files, dst.path) else dst.path
        try:
            summary = files.upload_dir(src, path)
        except OSError as exc:
            raise _local_error(src, exc) from None
        return f"{dst.name}:{path}", summary.entries, summary.bytes_written
    assert isinstance(src, Remote)
    files = client.files(src.name, workspace=workspace)
    if files.stat(src.path).type != "directory":
        where, size = copy(client, source, destination, workspace)
        return where, 1, size
    target = dst / posixpath.basename(src.path.rstrip("/")) if dst.is_dir() else dst
    try:
        summary = files.download_dir(src.path, target)
    except OSError as exc:
        raise _local_error(target, exc) from None
    return str(target), summary.entries, summary.bytes_written


def _remote_directory(files: Files, path: str) -> bool:
    from warmshell.sdk import errors

    if path.endswith("/"):
        return True
    try:
        return files.stat(path).type == "directory"
    except errors.NotFound:
        return False


def copy(client: Client, source: str, destination: str, workspace: str) -> tuple[str, int]:
    """Copy one file between here and a sandbox; (where it went, bytes copied)."""
    src, dst = _locations(source, destination)
    if isinstance(dst, Remote):
        assert isinstance(src, Path)
        if not src.is_file():
            if src.is_dir():
                raise CliError(f"{src}: is a directory (copy it with sandbox cp -r)", ExitCode.INVALID_ARGUMENT)
            raise _local_error(src, FileNotFoundError(2, "No such file or directory"))
        path = posixpath.join(dst.path, src.name) if dst.path.endswith("/") else dst.path
        files = client.files(dst.name, workspace=workspace)
        try:
            size = files.upload(src, path, mode=stat.S_IMODE(src.stat().st_mode))
        except OSError as exc:
            raise _local_error(src, exc) from None
        return f"{dst.name}:{path}", size
    assert isinstance(src, Remote)
    target = dst / posixpath.basename(src.path) if dst.is_dir() else dst
    files = client.files(src.name, workspace=workspace)
    try:
        size = files.download(src.path, target)
    except OSError as exc:
        raise _local_error(target, exc) from None
    return str(target), size


def list_files(client: Client, name: str, path: str, workspace: str) -> list[FileInfo]:
    """The entries of a directory in a sandbox (a relative path is under /workspace)."""
    return client.files(name, workspace=workspace).list(posixpath.join(WORKSPACE, path))


def listing_table(entries: list[FileInfo], *, now_ms: int) -> str:
    """MODE SIZE MODIFIED NAME, like `ls -l` without owners (a link shows `name -> target`)."""
    from warmshell.cli import render

    letters = {"file": "-", "directory": "d", "symlink": "l"}
    rows = [
        (
            letters.get(e.type, "?") + stat.filemode(e.mode)[1:],
            str(e.size),
            render.format_age(e.mtime_ms, now_ms),
            f"{e.name} -> {e.link_target}" if e.type == "symlink" else e.name + ("/" if e.type == "directory" else ""),
        )
        for e in entries
    ]
    return render.table(("MODE", "SIZE", "MODIFIED", "NAME"), rows, right=frozenset({1}))
