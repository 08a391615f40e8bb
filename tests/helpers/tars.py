"""Tar archives written entry by entry as an attacker would (any name, any type, any link
target), for the tests of the bulk file calls."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable


def tar_of(entries: Iterable[tuple[str, bytes, str]], content: bytes = b"PLANTED") -> bytes:
    """A PAX tar of (name, type, link target) entries; each regular file holds `content`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, kind, target in entries:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            data = content if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
