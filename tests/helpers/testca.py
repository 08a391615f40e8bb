"""A throwaway CA and a server certificate for an IP address, for HTTPS upstreams in tests."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey,
          *, ca: bool, address: str = "") -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if address:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


def server_context(directory: Path, address: str) -> tuple[ssl.SSLContext, Path]:
    """A TLS server context for `address`, and the file of the CA that signed it."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test upstream CA", ca_key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test upstream CA")]),
               ca_key, ca=True)  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert(address, key, ca.subject, ca_key, ca=False, address=address)
    ca_file, chain = directory / "upstream-ca.pem", directory / "upstream.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    chain.write_bytes(pem + leaf.public_bytes(serialization.Encoding.PEM))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return context, ca_file
