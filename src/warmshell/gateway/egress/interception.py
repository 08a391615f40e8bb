"""TLS interception for the hosts of placeholder secrets only: a per-gateway certificate
authority (its key 0600 in the state directory; with replicas, derived from the secrets key they
share, so a pod trusts the proxy of whichever replica its connection lands on), a leaf per host
made on demand, and the bundle sandboxes trust (the host's CAs plus this one). Every other host
is tunnelled untouched."""

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
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from warmshell.core import egress
from warmshell.core.errors import FailedPreconditionError
from warmshell.sandboxio import trust

__all__ = ["CertificateAuthority", "derived_key", "upstream_context"]

_KEY_FILE = "ca.key"
# Leaves live in memory only; a month is far beyond any sandbox's connection.
_LEAF_DAYS = 30
_CA_DAYS = 3650
# A derived CA's fixed validity: every replica makes the same certificate (but for its ECDSA
# signature, which is randomised), so each verifies the leaves of any other.
_DERIVED_NOT_BEFORE = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
_DERIVED_NOT_AFTER = datetime.datetime(2045, 1, 1, tzinfo=datetime.UTC)
_DERIVATION_CONTEXT = b"warmshell-egress-proxy-ca/v1"
_CA_NAME = "warmshell egress proxy CA"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def derived_key(secret: bytes) -> ec.EllipticCurvePrivateKey:
    """The CA key every gateway holding `secret` (the replicas' shared secrets key) derives alike;
    its own HKDF context, so it reveals nothing of the key it came from nor of other uses."""
    curve = ec.SECP256R1()
    material = HKDF(hashes.SHA256(), length=48, salt=None, info=_DERIVATION_CONTEXT).derive(secret)
    # 48 bytes reduced modulo the group order: a bias below 2**-128.
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
    return ec.derive_private_key(int.from_bytes(material) % (order - 1) + 1, curve)


class CertificateAuthority:
    """Loads (or makes, the first time) the gateway's CA in `directory` (blocking); with `seed`
    (the secrets key replicas share) its key is derived from that instead, held in memory only,
    and `directory` holds only the certificate, the bundle and the leaves' passing files."""

    def __init__(self, directory: Path, *, seed: bytes | None = None) -> None:
        self.directory = directory
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._key, self._cert = self._load_or_create() if seed is None else self._derive(seed)
            self._write_bundle()
        except (OSError, ValueError) as exc:
            raise FailedPreconditionError(f"the egress proxy's certificate authority in {directory}: {exc}") from exc

    @property
    def ca_file(self) -> Path:
        """The CA's certificate (public), for NODE_EXTRA_CA_CERTS."""
        return self.directory / egress.CA_FILE

    @property
    def bundle_file(self) -> Path:
        """The host's CAs and this one, for SSL_CERT_FILE and the like."""
        return self.directory / egress.BUNDLE_FILE

    def _load_or_create(self) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key_path, cert_path = self.directory / _KEY_FILE, self.directory / egress.CA_FILE
        if key_path.exists() and cert_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{key_path} is not an EC key")
            return key, x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(_CA_NAME))
            .issuer_name(_name(_CA_NAME))
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

    def _derive(self, seed: bytes) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = derived_key(seed)
        public = key.public_key()
        identifier = x509.SubjectKeyIdentifier.from_public_key(public)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(_CA_NAME))
            .issuer_name(_name(_CA_NAME))
            .public_key(public)
            .serial_number(int.from_bytes(identifier.digest[:16]) >> 1 or 1)  # positive, below 2**127
            .not_valid_before(_DERIVED_NOT_BEFORE)
            .not_valid_after(_DERIVED_NOT_AFTER)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(sign=True), critical=True)
            .add_extension(identifier, critical=False)
            .sign(key, hashes.SHA256())
        )
        return key, cert  # its certificate is written with the bundle

    @property
    def certificate_pem(self) -> bytes:
        """The CA's certificate (public; never its key), as a pod's supervisor is given it."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def _write_bundle(self) -> None:
        # 0600: the state directory stays private; sandboxes get copies.
        trust.write_trust(self.directory, self.certificate_pem, mode=0o600)

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
