"""The egress proxy's CA as replicas share it: derived from the secrets key they share, so a
leaf any replica makes verifies against the certificate any other handed a pod; its key is never
written; another key derives another CA."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from warmshell.core import egress
from warmshell.gateway.egress import interception

SHARED = b"k" * 32


async def handshake(server: ssl.SSLContext, trusted: Path, host: str = "127.0.0.2") -> None:
    """A real TLS handshake on loopback: a client trusting only `trusted` reaches a server
    presenting `server`'s leaf for `host` (an IP SAN), verifying it (SSLError when it fails)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server)
    port = listener.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(trusted))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=host)
        assert await reader.read() == b"ok"
        writer.close()
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_leaf_of_one_replica_verifies_against_the_ca_another_replica_gave(tmp_path: Path) -> None:
    one = interception.CertificateAuthority(tmp_path / "one", seed=SHARED)
    two = interception.CertificateAuthority(tmp_path / "two", seed=SHARED)
    first, second = (x509.load_pem_x509_certificate(ca.certificate_pem) for ca in (one, two))
    assert first.public_key() == second.public_key()
    assert first.subject == second.subject
    assert (first.serial_number, first.not_valid_after_utc) == (second.serial_number, second.not_valid_after_utc)
    await handshake(one.server_context("127.0.0.2"), two.ca_file)
    await handshake(two.server_context("127.0.0.2"), one.bundle_file)


async def test_another_secrets_key_derives_a_ca_that_verifies_nothing_of_this_one(tmp_path: Path) -> None:
    ours = interception.CertificateAuthority(tmp_path / "ours", seed=SHARED)
    theirs = interception.CertificateAuthority(tmp_path / "theirs", seed=b"x" * 32)
    assert interception.derived_key(SHARED).private_numbers() != interception.derived_key(b"x" * 32).private_numbers()
    with pytest.raises(ssl.SSLError):
        await handshake(theirs.server_context("127.0.0.2"), ours.ca_file)


def test_a_derived_ca_writes_no_key_and_its_files_are_private(tmp_path: Path) -> None:
    ca = interception.CertificateAuthority(tmp_path / "shared", seed=SHARED)
    ca.server_context("api.example")  # a leaf's key passes through a file while loaded
    files = sorted(p.name for p in ca.directory.iterdir())
    assert files == [egress.BUNDLE_FILE, egress.CA_FILE]
    assert all(b"PRIVATE KEY" not in (ca.directory / name).read_bytes() for name in files)
    assert all((ca.directory / name).stat().st_mode & 0o777 == 0o600 for name in files)
    key_pem = interception.derived_key(SHARED).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    assert key_pem not in ca.bundle_file.read_bytes()
