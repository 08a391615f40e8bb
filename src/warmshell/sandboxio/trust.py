"""The CA files a sandbox whose TLS the egress proxy intercepts trusts: the proxy's CA alone
(`egress.CA_FILE`) and a bundle of this host's CAs and it (`egress.BUNDLE_FILE`). The gateway
keeps its own bundle this way; a pod's supervisor writes the pair where its workload reads
them, the host's CAs there being its own container's."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from warmshell.core import egress

__all__ = ["host_bundle", "write_trust"]

# Where Debian, Ubuntu and Fedora keep the host's CAs, when Python's own default has none.
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def host_bundle() -> bytes:
    """This host's trusted CAs, PEM (empty when it has no bundle file)."""
    default = ssl.get_default_verify_paths().cafile
    found = next((Path(p) for p in (default, *_SYSTEM_BUNDLES) if p and os.path.exists(p)), None)
    return found.read_bytes() if found is not None else b""


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write `data` at `path` whole or not at all (a reader never sees half a bundle)."""
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_bytes(data)
    os.chmod(partial, mode)
    partial.replace(path)


def write_trust(directory: Path, ca_pem: bytes, *, mode: int = 0o644) -> None:
    """The CA and the bundle (this host's CAs, then the CA) in `directory`, made if missing
    (blocking). A certificate only: nothing written here is secret."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    bundle = host_bundle()
    if bundle and not bundle.endswith(b"\n"):
        bundle += b"\n"
    _replace(directory / egress.CA_FILE, ca_pem, mode)
    _replace(directory / egress.BUNDLE_FILE, bundle + ca_pem, mode)
