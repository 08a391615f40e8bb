"""TLS interception for the hosts of placeholder secrets only: a per-gateway certificate
authority (its key 0600 in the state directory), a leaf per host made on demand, and the bundle
sandboxes trust (the host's CAs plus this one). Every other host is tunnelled untouched."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from warmshell.core.errors import FailedPreconditionError

__all__ = ["BUNDLE_FILE", "CA_FILE", "CertificateAuthority", "upstream_context"]

CA_FILE = "ca.pem"
BUNDLE_FILE = "ca-bundle.pem"
_KEY_FILE = "ca.key"
# Leaves live in memory only; a month is far beyond any sandbox's connection.
_LEAF_DAYS = 30
_CA_DAYS = 3650
# Where Debian, Ubuntu and Fedora keep the host's CAs, when Python's own default has none.
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class CertificateAuthority:
    """Loads (or makes, the first time) the gateway's CA in `directory` (blocking)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._key, self._cert = self._load_or_create()
            self._write_bundle()
        except (OSError, ValueError) as exc:
            raise FailedPreconditionError(f"the egress proxy's certificate authority in {directory}: {exc}") from exc

    @property
    def ca_file(self) -> Path:
        """The CA's certificate (public), for NODE_EXTRA_CA_CERTS."""
        return self.directory / CA_FILE

    @property
    def bundle_file(self) -> Path:
        """The host's CAs and this one, for SSL_CERT_FILE and the like."""
        return self.directory / BUNDLE_FILE

    def _load_or_create(self) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key_path, cert_path = self.directory / _KEY_FILE, self.directory / CA_FILE
        if key_path.exists() and cert_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{key_path} is not an EC key")
            return key, x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("warmshell egress proxy CA"))
            .issuer_name(_name("warmshell egress proxy CA"))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=_CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(pem)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        os.chmod(cert_path, 0o600)  # the state directory stays private; sandboxes get copies
        return key, cert

    def _write_bundle(self) -> None:
        system = ssl.get_default_verify_paths().cafile
        found = next((Path(p) for p in (system, *_SYSTEM_BUNDLES) if p and os.path.exists(p)), None)
        text = (found.read_bytes() if found else b"") + self.ca_file.read_bytes()
        partial = self.bundle_file.with_suffix(".tmp")
        partial.write_bytes(text)
        os.chmod(partial, 0o600)
        partial.replace(self.bundle_file)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for `host` (a name or an IP), made once per
        host (blocking the first time: a key and a signature)."""
        with self._lock:
            context = self._contexts.get(host)
            if context is None:
                context = self._contexts[host] = self._leaf_context(host)
            return context

    def _leaf_context(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        try:
            alternative: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alternative = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=_LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([alternative]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_alpn_protocols(["http/1.1"])  # the proxy reads HTTP/1.1 heads, never HTTP/2
        # ssl loads a chain only from a file: a private one, gone once loaded.
        with tempfile.NamedTemporaryFile(dir=self.directory, suffix=".pem") as chain:
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            chain.write(pem + cert.public_bytes(serialization.Encoding.PEM))
            chain.flush()
            context.load_cert_chain(chain.name)
        return context


def _key_usage(*, sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign,
        crl_sign=sign,
        encipher_only=False,
        decipher_only=False,
    )


def upstream_context(extra_ca_file: str) -> ssl.SSLContext:
    """Verifies upstreams against the host's trust store, plus `extra_ca_file` when set."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    if extra_ca_file:
        try:
            context.load_verify_locations(extra_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise FailedPreconditionError(f"network.upstream_ca_file {extra_ca_file!r}: {exc}") from exc
    return context
