"""The /etc of sandboxes on the host's root: the allow-listed entries copied into one directory,
bound at /etc with one mount (and one more per allowed directory too big to copy).

Every bind costs bwrap a mount, a read-only remount and a scan of the (growing) mount table:
binding each allowed /etc file on its own was about half of the CPU of a sandbox start, and the
allowed directories (`ssl`, `alternatives`, ...) bound one each were still 6 of the 9 binds left
(`bench/investigations/member-start/`). So files are copied (their content: a symlink at the top is followed,
as a bind would), and so is each allowed directory of at most `TREE_LIMIT` entries, as a tree
whose symlinks stay symlinks (they resolve inside the sandbox exactly as through a bind). A
larger directory (this host's `alternatives` and `ssl` are symlink farms of hundreds of entries,
whose copy took most of a second of a gateway's first start on a busy disk) keeps a bind of its
own over an empty mount point in the copy: decided once, when the stage is made. A copy keeps its
source's permission bits and mtime (and, for a gateway run as root, its owner), so a sandbox reads
in the copy what it could read through a bind, except that inside a copied tree tool configs that
may hold tokens (`NEVER_COPIED`, as the allow-list leaves them out of /etc) are left out, and what
not everyone may read is an empty placeholder with the source's owner and mode (no private key
is copied about).

The system CA bundle's directory (`ssl`) is copied whatever its size, and in the copy the bundle
(`egress.SYSTEM_BUNDLE`) is a symlink into the sandbox's egress directory, whose own link
(`link_system_bundle`, made at each start) leads back to the host's bundle kept beside it
(`egress.HOST_BUNDLE`). A sandbox reads the host's bundle byte for byte through the two links,
until an activation whose TLS is intercepted replaces its egress directory's link with one to the
bundle of the host's CAs and the gateway's (below): the one sandbox's trust changes, no other's. A copy of the
~220 KB bundle per start, bound over a bind of the host's /etc/ssl, cost each member start two
mounts and ~0.5 ms of CPU more, and the bundle's bytes in RAM per sandbox on the runtime tmpfs.

The gateway's CA and the bundle of the host's CAs and it are placed once per gateway in the same
copy (`egress.SHARED_TRUST_DIR`, from `trust`, which the gateway calls once its CA is loaded or
made, whether or not the stage exists yet; every later copy of the directory gets them again,
its bundle from the host's bundle as copied then). A CA certificate is public: every sandbox may
read these files, and what it *trusts* is its system bundle link and the environment its
activation gives it (`egress.trust_environment`), both the gateway's CA's only when its policy
intercepts TLS. An intercepting activation then only relinks the sandbox's egress directory
here: copying the CA and the ~220 KB bundle into it and over its system bundle link took
~0.4 ms of gateway CPU and a thread hop per activation. The CA is not rotated while a gateway
runs (it is loaded or made at its start; the stage is made afresh at each start).

The copies are checked before every start and refreshed when a source changed: a file by its
inode, size and mtime; a tree by those of each of its directories and regular files (an entry
added, removed, renamed or relinked changes its directory; a file edited in place changes itself),
so a check is one stat per file and directory, never a walk. A changed tree is copied afresh
beside the old one and swapped in by two renames: a sandbox starting in between sees the old tree,
the new one, or (for that instant) none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from warmshell.core import egress
from warmshell.sandboxio import trust

__all__ = ["NEVER_COPIED", "TREE_LIMIT", "EtcStage", "link_system_bundle", "too_big_to_copy"]

# The most entries (files, directories and symlinks, at any depth) of an allowed directory that is
# copied rather than bound.
TREE_LIMIT = 64

# Names inside an allowed directory that are never copied (e.g. /etc/xdg/pip/pip.conf).
NEVER_COPIED = frozenset({"pip.conf", "npmrc", ".npmrc", "gitconfig", ".gitconfig", ".git-credentials"})

_Signature = tuple[tuple[int, int, int, int], ...]

# The system bundle under /etc (ssl/certs/ca-certificates.crt), its top directory always copied.
_BUNDLE = PurePosixPath(egress.SYSTEM_BUNDLE).relative_to("/etc")
_HOST_BUNDLE = PurePosixPath(egress.HOST_BUNDLE).relative_to("/etc")
# What the staged bundle links to: the sandbox's own link (or file) in its egress directory.
_BUNDLE_LINK = f"{egress.SANDBOX_DIR}/{egress.SYSTEM_BUNDLE_COPY}"
# Where the gateway's CA and its bundle go, inside the bundle's top directory (copied with it).
_SHARED_TRUST = PurePosixPath(egress.SHARED_TRUST_DIR).relative_to("/etc")
assert _SHARED_TRUST.parts[0] == _BUNDLE.parts[0]


class EtcStage:
    """One staged /etc directory and what each of its copies was made from."""

    def __init__(self, directory: Path, source: Path, allowed: Sequence[str]) -> None:
        """`allowed` names the entries of `source` (the host's /etc) to stage; `directory` holds
        the copies (made 0755, owned by the gateway's uid). Nothing is read before `refresh`."""
        self.directory = directory
        self._source = source
        self._allowed = frozenset(allowed)
        self._names: tuple[str, ...] | None = None  # what is copied
        self._copied: dict[str, tuple[_Signature, tuple[Path, ...]]] = {}
        self._lock = threading.Lock()
        # The allowed directories bound on their own (too big to copy), each an empty mount point.
        self.subdirectories: tuple[str, ...] = ()
        # Whether the staged system bundle is the link into the egress directory (the host has
        # that bundle as a regular file): then each start needs `link_system_bundle`.
        self.bundle_linked = False
        self._authority: bytes | None = None  # the gateway's CA certificate (PEM), once told

    def trust(self, certificate_pem: bytes) -> None:
        """Blocking: the gateway's CA and the bundle of the host's CAs and it in the staged
        `egress.SHARED_TRUST_DIR`, now if the bundle is linked already and in every later copy
        (OSError when they cannot be written now)."""
        with self._lock:
            self._authority = certificate_pem
            if self.bundle_linked:
                _place_authority(self.directory / _BUNDLE.parts[0], certificate_pem)

    def refresh(self) -> None:
        """Blocking, and safe from several threads at once: bring every copy up to date with its
        source (cheap when nothing changed: one stat per copied file and directory)."""
        with self._lock:
            if self._names is None:
                self._create()
            assert self._names is not None
            for name in self._names:
                copied = self._copied.get(name)
                if copied is not None and _signature(copied[1]) == copied[0]:
                    continue
                if os.path.exists(self._source / name):
                    self._copy(name)
                elif self._copied.pop(name, None) is not None:  # gone from the host
                    _remove(self.directory / name)
                    self.bundle_linked = self.bundle_linked and name != _BUNDLE.parts[0]

    def remove(self) -> None:
        """Blocking: remove the directory (the gateway stops; its sandboxes have ended)."""
        with self._lock:
            shutil.rmtree(self.directory, ignore_errors=True)
            self._copied.clear()
            self._names = None
            self.subdirectories = ()
            self.bundle_linked = False

    def _create(self) -> None:
        """A fresh directory (whatever a previous gateway left is removed), with a mount point for
        every allowed directory too big to copy."""
        names = sorted(set(os.listdir(self._source)) & self._allowed)
        bound = tuple(name for name in names if name != _BUNDLE.parts[0] and too_big_to_copy(self._source / name))
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(mode=0o755, parents=True)
        os.chmod(self.directory, 0o755)
        for name in bound:
            (self.directory / name).mkdir(mode=0o755)
        self._names = tuple(name for name in names if name not in bound)
        self.subdirectories = bound

    def _copy(self, name: str) -> None:
        """Copy one entry, recording what it was copied from (taken before the copy: a change
        made while copying makes the next refresh copy again); a source that vanished meanwhile
        or is neither a file nor a directory is left out."""
        source, partial = self._source / name, self.directory / f".{name}.partial"
        _remove(partial)
        try:
            info = os.stat(source)
            paths = _tree(source) if stat.S_ISDIR(info.st_mode) else (source,)
            signature = _signature(paths)
            if signature is None or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                return
            if stat.S_ISDIR(info.st_mode):
                _copy_tree(source, partial)
            else:
                _copy_file(source, partial, follow=True)
            linked = name == _BUNDLE.parts[0] and _link_bundle(partial)
            if linked and self._authority is not None:
                _place_authority(partial, self._authority)
        except OSError:
            _remove(partial)
            return
        target = self.directory / name
        try:
            if os.path.isdir(partial) or os.path.isdir(target):  # a directory cannot be replaced in one rename
                old = self.directory / f".{name}.old"
                _remove(old)
                if os.path.lexists(target):
                    os.rename(target, old)
                os.rename(partial, target)
                _remove(old)
            else:
                os.replace(partial, target)  # a sandbox starting now sees old or new, whole
        except OSError:  # the previous copy stays; the next refresh tries again
            _remove(partial)
            return
        self._copied[name] = (signature, paths)
        if name == _BUNDLE.parts[0]:
            self.bundle_linked = linked


def _link_bundle(copy: Path) -> bool:
    """In a fresh copy of the bundle's top directory: the bundle kept as `egress.HOST_BUNDLE`, and
    a symlink into the egress directory in its place; False (the copy left as it is) when the
    copy has no regular file there (a host whose bundle is a link elsewhere, or none)."""
    bundle = copy / PurePosixPath(*_BUNDLE.parts[1:])
    if not bundle.is_file() or bundle.is_symlink():
        return False
    with _writable(bundle.parent):
        os.rename(bundle, copy / PurePosixPath(*_HOST_BUNDLE.parts[1:]))
        os.symlink(_BUNDLE_LINK, bundle)
    return True


def _place_authority(copy: Path, certificate_pem: bytes) -> None:
    """In the bundle's top directory's copy: the CA and the bundle of the staged host bundle and
    it, public (0644, their directory 0755), written aside and renamed over."""
    with _writable(copy):
        host = (copy / PurePosixPath(*_HOST_BUNDLE.parts[1:])).read_bytes()
        directory = copy / PurePosixPath(*_SHARED_TRUST.parts[1:])
        trust.write_trust(directory, certificate_pem, host=host)
        os.chmod(directory, 0o755)  # whatever the umask


@contextlib.contextmanager
def _writable(directory: Path) -> Iterator[None]:
    """`directory` writable by its owner for the body, its mode restored after (a copy keeps its
    source's bits: 0555, say)."""
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    os.chmod(directory, mode | stat.S_IWUSR)
    try:
        yield
    finally:
        os.chmod(directory, mode)


def link_system_bundle(egress_dir: Path) -> None:
    """The sandbox's link to the host's bundle in its new egress directory (blocking; a stage
    with `bundle_linked` only), and before it the names its trust variables would give
    (`egress.TRUST_LINKS`), so that an activation finding the first finds them all. A symlink,
    not a hard link of one shared file: a link count would tell every sandbox how many others
    share it, and the activation replaces the system bundle's name, never writes through it
    (`sandboxio.trust.replace_links`).

    The trust names are made here, at every start, rather than at an intercepting activation,
    which then relinks one name instead of three (55 -> 23 us of CPU hot on ext4, 31 -> 14 on
    tmpfs; the three took 85-98 us on a create's cold caches), for two plain symlinks more at
    each start (19 us on ext4, 10 on tmpfs), in its spawn thread. They lead to the public CA and
    bundle every sandbox on the host's root may read anyway; nothing trusts them until an
    activation that intercepts gives the variables naming them."""
    for name, target in egress.TRUST_LINKS.items():
        os.symlink(target, egress_dir / name)
    os.symlink(egress.HOST_BUNDLE, egress_dir / egress.SYSTEM_BUNDLE_COPY)


def too_big_to_copy(path: Path) -> bool:
    """Whether `path` is a directory of more than `TREE_LIMIT` entries (bound, not copied)."""
    if not path.is_dir():
        return False
    seen = 0
    for _, subdirs, files in os.walk(path):
        seen += len(subdirs) + len(files)
        if seen > TREE_LIMIT:
            return True
    return False


def _sorted_out(directory: str, names: Sequence[str]) -> tuple[set[str], set[str]]:
    """Of `names` in `directory` (inside a tree): those never copied (`NEVER_COPIED`, or gone),
    and those only not everyone may read (a file without o+r, a directory without o+x, such as
    ssl/private), which become empty placeholders."""
    never, private = set(), set()
    for name in names:
        try:
            mode = os.lstat(os.path.join(directory, name)).st_mode
        except OSError:
            never.add(name)
            continue
        if name in NEVER_COPIED:
            never.add(name)
        elif (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH) or (stat.S_ISREG(mode) and not mode & stat.S_IROTH):
            private.add(name)
    return never, private


def _tree(top: Path) -> tuple[Path, ...]:
    """`top` and every directory and regular file below it that is staged (symlinks are not
    followed, private directories not entered)."""
    found = [top]
    for directory, subdirs, files in os.walk(top):
        never, private = _sorted_out(directory, [*subdirs, *files])
        found += [
            Path(directory, name) for name in subdirs if name not in never and not os.path.islink(Path(directory, name))
        ]
        subdirs[:] = [name for name in subdirs if name not in never and name not in private]
        for name in files:
            path = Path(directory, name)
            if name not in never and stat.S_ISREG(os.lstat(path).st_mode):
                found.append(path)
    return tuple(found)


def _signature(paths: Sequence[Path]) -> _Signature | None:
    """Inode, device, size and mtime of each path (the first followed if a symlink, as a bind
    would; the rest not); None when one is gone."""
    signature = []
    for index, path in enumerate(paths):
        try:
            info = os.stat(path) if index == 0 else os.lstat(path)
        except OSError:
            return None
        signature.append((info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(signature)


def _copy_tree(source: Path, target: Path) -> None:
    """`source` as a tree at `target`: symlinks kept, `NEVER_COPIED` left out, private entries as
    empty placeholders (a listing shows them, as through a bind, but no private key is copied
    about), every copy with its source's metadata (`copytree` keeps the directories' bits and
    times; owners are set here)."""
    placeholders: list[tuple[Path, Path]] = []

    def ignore(directory: str, names: list[str]) -> set[str]:
        never, private = _sorted_out(directory, names)
        inside = target / os.path.relpath(directory, source)
        placeholders.extend((Path(directory, name), inside / name) for name in private)
        return never | private

    # Errors are what the gateway cannot read, which a sandbox could not read either: left out.
    with contextlib.suppress(shutil.Error):
        shutil.copytree(source, target, symlinks=True, copy_function=_copy_file, ignore=ignore)
    for original, placeholder in placeholders:
        info = os.lstat(original)
        if stat.S_ISDIR(info.st_mode):
            placeholder.mkdir(mode=0o700)
        else:
            placeholder.touch(mode=0o600)
        _keep_metadata(placeholder, info)
        parent = os.stat(original.parent)  # the placeholder changed its directory's mtime
        os.utime(placeholder.parent, ns=(parent.st_atime_ns, parent.st_mtime_ns))
    if os.geteuid() == 0:
        for directory, _, _ in os.walk(target):
            info = os.stat(source / os.path.relpath(directory, target))
            os.chown(directory, info.st_uid, info.st_gid)


def _copy_file(source: str | Path, target: str | Path, *, follow: bool = False) -> None:
    shutil.copyfile(source, target, follow_symlinks=follow)
    _keep_metadata(Path(target), os.stat(source) if follow else os.lstat(source))


def _keep_metadata(target: Path, info: os.stat_result) -> None:
    """The source's permission bits, times and (as root) owner."""
    os.chmod(target, stat.S_IMODE(info.st_mode) & 0o777)
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    if os.geteuid() == 0:
        os.chown(target, info.st_uid, info.st_gid)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        if os.geteuid() != 0:  # a copy keeps its source's bits: a directory may be read-only to us
            for directory, _, _ in os.walk(path):
                with contextlib.suppress(OSError):
                    os.chmod(directory, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
