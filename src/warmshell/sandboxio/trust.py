"""The CA files a sandbox whose TLS the egress proxy intercepts trusts: the proxy's CA alone
(`egress.CA_FILE`) and a bundle of this host's CAs and it (`egress.BUNDLE_FILE`). The gateway
keeps its own bundle this way; a pod's supervisor writes the pair where its workload reads
them, the host's CAs there being its own container's."""

from __future__ import annotations

import contextlib
import os
import secrets
import ssl

from warmshell.core import egress

# No pathlib here: a pod's supervisor imports this module, and pathlib (with what it loads)
# costs each supervisor ~0.5 MiB.

__all__ = ["host_bundle", "relink", "replace_links", "write_trust"]

# Where Debian, Ubuntu and Fedora keep the host's CAs, when Python's own default has none.
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def host_bundle() -> bytes:
    """This host's trusted CAs, PEM (empty when it has no bundle file)."""
    default = ssl.get_default_verify_paths().cafile
    found = next((p for p in (default, *_SYSTEM_BUNDLES) if p and os.path.exists(p)), None)
    if found is None:
        return b""
    with open(found, "rb") as bundle:
        return bundle.read()


def _replace(directory: int, name: str, data: bytes, mode: int) -> None:
    """Write `data` as `name` in the open `directory` whole or not at all (a reader never sees
    half a bundle), following no link: a name the workload planted is replaced, never written
    through."""
    partial = f".{name}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(partial, flags, mode, dir_fd=directory)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # whatever the umask
            handle.write(data)
        os.replace(partial, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial, dir_fd=directory)
        raise


def replace_links(directory: str | os.PathLike[str], links: dict[str, str]) -> None:
    """Each name of `links` in `directory` a symlink to its target (blocking: a symlink and a
    rename, ~12 µs of CPU each on tmpfs): made aside and renamed over, so a reader sees the old
    entry or the new link, and a link or file already there is replaced, never written through.
    `directory` itself must not be a link (OSError)."""
    opened = _open_directory(directory)
    try:
        for name, target in links.items():
            _link_over(opened, name, target)
    finally:
        os.close(opened)


def relink(directory: str | os.PathLike[str], name: str, target: str) -> bool:
    """As `replace_links` for one name, only when `directory` has an entry of that name already
    (False, nothing done, else). The check is made on the directory as opened (no path walked
    twice): an intercepting activation's one relink, on the event loop."""
    opened = _open_directory(directory)
    try:
        try:
            os.stat(name, dir_fd=opened, follow_symlinks=False)
        except FileNotFoundError:
            return False
        _link_over(opened, name, target)
        return True
    finally:
        os.close(opened)


def _open_directory(directory: str | os.PathLike[str]) -> int:
    """`directory` opened for the *at() calls, refused (OSError) when it is itself a link."""
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _link_over(directory: int, name: str, target: str) -> None:
    """`name` in the open `directory` a symlink to `target`, made aside and renamed over."""
    partial = f".{name}.{secrets.token_hex(4)}.tmp"
    os.symlink(target, partial, dir_fd=directory)
    try:
        os.replace(partial, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial, dir_fd=directory)
        raise


def write_trust(
    directory: str | os.PathLike[str], ca_pem: bytes, *, mode: int = 0o644, host: bytes | None = None
) -> None:
    """The CA and the bundle (this host's CAs, then the CA) in `directory`, made if missing
    (blocking). A certificate only: nothing written here is secret. Where the directory is
    shared with a workload (a pod's channel volume) it may have planted links: `directory`
    itself must not be one (OSError), and no file in it is written through one. `host`: the
    host's CAs as read already (None: `host_bundle()`)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o755)
    opened = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        bundle = host_bundle() if host is None else host
        if bundle and not bundle.endswith(b"\n"):
            bundle += b"\n"
        _replace(opened, egress.CA_FILE, ca_pem, mode)
        _replace(opened, egress.BUNDLE_FILE, bundle + ca_pem, mode)
    finally:
        os.close(opened)
