"""Per-sandbox proxy credentials, for sandboxes that reach the egress proxy over the network
(Kubernetes pods, where no socket per sandbox can say whose a connection is).

A credential is a random nonce and an HMAC over the sandbox id and that nonce, keyed from the
secrets key every replica shares: any replica verifies it without a store write at activation
(the activation stays one signature), and it buys exactly the sandbox it was issued for — the
sandbox id is the Basic user name, and a credential presented under another id fails its MAC.
Where the supervisor registered from an IP address (a pod's), the MAC covers that address too,
and the credential is good only on connections from it: a credential copied into another pod
(another address) buys nothing. Over a Unix socket there is no address to bind to.
The placeholders of the sandbox's host-bound secrets are derived from the same nonce, so the
replica a connection lands on swaps the tokens another replica handed to the workload. That a
sandbox still exists and is not ending is checked per connection, by the caller, in the store.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

from warmshell.gateway.egress import placeholders
from warmshell.gateway.egress.heads import Head

__all__ = ["PREFIX", "Presented", "ProxyCredentials", "presented", "source_address"]

PREFIX = "wsx_"
_NONCE_BYTES = 16
_CONTEXT = b"warmshell-egress-proxy-credential/v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def source_address(peer: str) -> str:
    """The IP address in a peer name (gRPC's "ipv4:10.1.2.3:5678", "ipv6:[::1]:5678", or a bare
    address), IPv4-mapped IPv6 as IPv4; "" for anything else (a Unix socket)."""
    kind, _, rest = peer.partition(":")
    if not peer or kind == "unix":  # every local member's registration (in process): no parse, no error raised
        return ""
    if kind in ("ipv4", "ipv6"):
        peer = rest.rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return ""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


@dataclass(frozen=True)
class Presented:
    """What a connection's `Proxy-Authorization: Basic` carried, and where it came from."""

    sandbox_id: str
    credential: str
    source: str = ""  # the connection's IP address (`source_address`)


def presented(head: Head, source: str = "") -> Presented | None:
    """The Basic credentials of a proxy request from `source` (None: none, or not Basic, or
    malformed)."""
    for name, value in head.headers:
        if name.lower() != b"proxy-authorization":
            continue
        scheme, _, encoded = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            return None
        try:
            user, colon, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return Presented(user, password, source) if colon and user else None
    return None


class ProxyCredentials:
    """Issues and verifies the credentials of one gateway's (or replica set's) sandboxes."""

    def __init__(self, key: bytes) -> None:
        """`key`: the shared secrets key (a purpose-bound key is derived from it)."""
        self._key = hmac.new(key, _CONTEXT, hashlib.sha256).digest()

    def _mac(self, sandbox_id: str, nonce: bytes, source: str) -> bytes:
        message = b"\0".join([b"sandbox", sandbox_id.encode(), nonce, source.encode()])
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def issue(self, sandbox_id: str, source: str = "") -> str:
        """A fresh credential for the sandbox (one per activation), good only on connections
        from IP address `source` when one is given."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        return f"{PREFIX}{_b64(nonce)}.{_b64(self._mac(sandbox_id, nonce, source))}"

    def verify(self, sandbox_id: str, credential: str, source: str = "") -> bytes | None:
        """The credential's nonce when it was issued for `sandbox_id`, unbound or bound to
        `source` (None: it was not)."""
        body = credential.removeprefix(PREFIX)
        nonce_text, dot, mac_text = body.partition(".")
        if body == credential or not dot:
            return None
        try:
            nonce, mac = _unb64(nonce_text), _unb64(mac_text)
        except (binascii.Error, ValueError):
            return None
        # One spelling per credential: base64's spare low bits in the last character (and
        # characters the decoder skips) would otherwise let altered text verify.
        if len(nonce) != _NONCE_BYTES or _b64(nonce) != nonce_text or _b64(mac) != mac_text:
            return None
        unbound = hmac.compare_digest(mac, self._mac(sandbox_id, nonce, ""))
        bound = bool(source) and hmac.compare_digest(mac, self._mac(sandbox_id, nonce, source))
        return nonce if unbound or bound else None

    def placeholder(self, sandbox_id: str, nonce: bytes, name: str) -> str:
        """The placeholder token of secret `name` for the activation that issued `nonce`."""
        digest = hmac.new(self._key, b"placeholder\0" + sandbox_id.encode() + b"\0" + nonce + name.encode(), "sha256")
        return placeholders.PREFIX + _b64(digest.digest()[:24])
