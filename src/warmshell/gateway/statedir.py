"""The gateway's state directory is trusted with its secrets (api-token, signing-key.pem, the
store): before anything is read from it, it must be ours and writable by no one else, and what
the gateway creates in it is private from the start (umask 077), not chmod-ed afterwards."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from warmshell.core.errors import FailedPreconditionError

__all__ = ["PRIVATE_UMASK", "ensure_state_dir", "private_umask", "state_dir_problem"]

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077


def state_dir_problem(path: Path, *, mode: int, owner: int, uid: int) -> str | None:
    """Why a state dir with this mode and owner cannot be trusted (one line naming the path and
    the fix), or None when it can."""
    if not stat.S_ISDIR(mode):
        return f"state dir {path} is not a directory; fix: remove it or choose another --state-dir"
    if owner != uid:
        return f"state dir {path} is owned by uid {owner}, not by this gateway's uid {uid}; fix: chown {uid} {path}"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"state dir {path} is group- or world-writable (mode {stat.S_IMODE(mode):04o}), so another user "
            f"could plant its api-token or signing key; fix: chmod 700 {path}"
        )
    return None


def ensure_state_dir(path: Path, *, private_volume: bool = False) -> None:
    """Create the state dir 0700 (with private parents), or refuse an existing one that is not
    ours alone (FailedPreconditionError). `private_volume`: the dir is a volume only this
    gateway's pod mounts, whose mode and owner say nothing (see GatewayConfig)."""
    with private_umask():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if private_volume:
        log.info("state dir %s: mode and owner not checked (state_dir_private_volume)", path)
        return
    info = os.stat(path)
    problem = state_dir_problem(path, mode=info.st_mode, owner=info.st_uid, uid=os.geteuid())
    if problem is not None:
        raise FailedPreconditionError(problem)


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Files and sockets created inside are private to the gateway's uid. The umask is
    process-wide: hold it only around the gateway's own creations (the event loop runs nothing
    else meanwhile), never while sandboxes are started — they would inherit it — nor once calls
    are served (an image import takes the umask it reads as what its files' modes lose)."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)
