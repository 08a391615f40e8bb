"""A layer's tar stream read by libarchive (the C library, through `libarchive-c`): its entries'
headers, and each file's data copied straight into a descriptor.

Python's `tarfile` took ~0.67 s of CPU to parse the ~8,700 headers of a 170 MB Debian root and
copy its data through Python, twice what `tar -x` spends on the whole extraction; libarchive does
the same in ~0.2 s, and `archive_read_data_into_fd` writes a file's data without it passing
through Python. The bytes still come from the caller's reader (the digests are computed and the
bound counted there), into one block refilled at each callback; only the tar format is enabled
(no compression filter, no other format: decompression stays with the digest-checking readers).
"""

from __future__ import annotations

import ctypes
import stat
from collections.abc import Iterator
from typing import Any, Protocol

import libarchive.ffi as ffi
from libarchive.exception import ArchiveError

from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.local.imagestore.entries import Entry, Kind

__all__ = ["Source", "TarReader"]

_BLOCK = 1 << 20
_FATAL = -30  # ARCHIVE_FATAL: what a read callback returns when its source failed
_WARN = -20  # ARCHIVE_WARN
_TYPE, _PERM = 0o170000, 0o7777  # libarchive's AE_IFMT, and what its archive_entry_perm keeps
_HARDLINK, _SYMLINK, _OTHER = Kind.HARDLINK, Kind.SYMLINK, Kind.OTHER  # read once: ~160 ns each through Kind
_KINDS = {
    stat.S_IFREG: Kind.FILE,
    stat.S_IFDIR: Kind.DIRECTORY,
    stat.S_IFLNK: Kind.SYMLINK,
    stat.S_IFCHR: Kind.DEVICE,
    stat.S_IFBLK: Kind.DEVICE,
    stat.S_IFIFO: Kind.FIFO,
}


def _function(name: str, argtypes: list[type], restype: type) -> Any:
    # A function object of our own (indexing makes a new one; libarchive-c's are shared and
    # carry its Python error check): a layer is ~9,000 entries, each half a dozen calls into C,
    # and the return codes are checked here, once, by `TarReader._check`.
    function = ffi.libarchive["archive_" + name]
    function.argtypes = argtypes
    function.restype = restype
    return function


_entry_p, _archive_p = ffi.c_archive_entry_p, ffi.c_archive_p
_next_header = _function("read_next_header2", [_archive_p, _entry_p], ctypes.c_int)
_data_into_fd = _function("read_data_into_fd", [_archive_p, ctypes.c_int], ctypes.c_int)
_mode = _function("entry_mode", [_entry_p], ctypes.c_uint)  # the type bits and the permission bits
_size = _function("entry_size", [_entry_p], ctypes.c_longlong)
# Names as UTF-8 whatever the process's locale (a pax header's are), else the header's own bytes.
_pathname_utf8 = _function("entry_pathname_utf8", [_entry_p], ctypes.c_char_p)
_pathname = _function("entry_pathname", [_entry_p], ctypes.c_char_p)
_hardlink_utf8 = _function("entry_hardlink_utf8", [_entry_p], ctypes.c_char_p)
_hardlink = _function("entry_hardlink", [_entry_p], ctypes.c_char_p)
_symlink_utf8 = _function("entry_symlink_utf8", [_entry_p], ctypes.c_char_p)
_symlink = _function("entry_symlink", [_entry_p], ctypes.c_char_p)


class Source(Protocol):
    """Where the tar's bytes come from (e.g. `extracting.BoundedReader`)."""

    def readinto(self, buffer: memoryview, /) -> int:
        """Fill up to `len(buffer)` bytes of `buffer`; how many (0 at the end)."""
        ...


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "surrogateescape") if raw else ""


class TarReader:
    """The entries of one tar stream, in order (a context manager: it holds libarchive's
    reader). Anything wrong with the stream is InvalidArgumentError naming `where`; an error
    of the source itself (a digest, the store's bound) is raised as the source raised it."""

    def __init__(self, source: Source, *, where: str) -> None:
        self._source = source
        self._where = where
        # The one block libarchive reads from, refilled at each callback (libarchive is done
        # with a block when it asks for the next). Exported to ctypes, it can never be resized.
        self._block = bytearray(_BLOCK)
        self._view = memoryview(self._block)
        self._address = ctypes.addressof((ctypes.c_char * _BLOCK).from_buffer(self._block))
        self._failure: BaseException | None = None
        # Kept referenced: libarchive calls it until the reader is freed.
        self._callback = ffi.READ_CALLBACK(self._read)
        self._archive: ctypes.c_void_p | None = None
        self._entry = ctypes.c_void_p()

    def __enter__(self) -> TarReader:
        archive = ffi.read_new()
        try:
            ffi.get_read_format_function("tar")(archive)
            ffi.get_read_filter_function("none")(archive)
            ffi.read_open(archive, None, ffi.NO_OPEN_CB, self._callback, ffi.NO_CLOSE_CB)
        except ArchiveError as exc:
            ffi.read_free(archive)
            if self._failure is not None:  # libarchive reads the first block as it opens
                raise self._failure from None
            raise self._failed(exc.msg) from None
        except BaseException:
            ffi.read_free(archive)
            raise
        self._archive = ctypes.c_void_p(archive)
        self._entry = ctypes.c_void_p(ffi.entry_new())
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._archive is not None:
            ffi.read_free(self._archive)
            ffi.entry_free(self._entry)
            self._archive = None

    def __iter__(self) -> Iterator[Entry]:
        archive, entry = self._archive, self._entry
        while self._check(_next_header(archive, entry)) != ffi.ARCHIVE_EOF:
            yield self._entry_now(entry)

    def copy_to(self, fd: int) -> None:
        """Write the current entry's data to `fd` (in C: libarchive's own read and write loop)."""
        self._check(_data_into_fd(self._archive, fd))

    def _entry_now(self, entry: ctypes.c_void_p) -> Entry:
        name = _pathname_utf8(entry) or _pathname(entry)
        if name is None:
            raise InvalidArgumentError(self._where, "has an entry without a path")
        mode = _mode(entry)
        hardlink = _hardlink_utf8(entry) or _hardlink(entry)
        if hardlink is not None:
            return Entry(_text(name), _HARDLINK, mode & _PERM, _size(entry), _text(hardlink))
        kind = _KINDS.get(mode & _TYPE, _OTHER)
        link = _text(_symlink_utf8(entry) or _symlink(entry)) if kind is _SYMLINK else ""
        return Entry(_text(name), kind, mode & _PERM, _size(entry), link)

    def _check(self, result: int) -> int:
        """`result` of a call into libarchive, unless it failed (a warning is no failure: the
        tar format's warnings are of headers it could read, e.g. an unknown pax keyword)."""
        if result >= _WARN:
            return result
        if self._failure is not None:
            raise self._failure
        raise self._failed(ffi.error_string(self._archive))

    def _failed(self, message: str | bytes | None) -> InvalidArgumentError:
        text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message or "no reason given"
        return InvalidArgumentError(self._where, f"is not a readable tar stream ({text})")

    def _read(self, _archive: int, _context: int, pointer: ctypes._Pointer[ctypes.c_void_p]) -> int:
        # An exception cannot cross libarchive: it is kept, and libarchive told the read failed.
        try:
            n = self._source.readinto(self._view)
        except BaseException as exc:
            self._failure = exc
            return _FATAL
        pointer[0] = self._address
        return n
