"""Egress policy (pure): the rules a sandbox's outbound connections are checked against.

A rule is `HOST[:PORT]`, `*.DOMAIN[:PORT]`, an IP (`[v6]:PORT` for a port) or a CIDR; no port
means any port. A policy is a deny list and one or more allow lists: a connection passes when no
deny rule matches it and every allow list has a rule that does (the gateway's default, the
profile and a request each narrow what the layer before allows; see `compose`).

Checked twice by the proxy: on the name and port the workload asked for (`check_name`), then on
each address the proxy resolved (`check_address`). An IP or CIDR rule matches a connection asked
for by address (a name that resolves into it still needs a name rule). An internal address (loopback, link-local,
private, reserved, or one of the host's own) passes only when every allow list names it with an
IP or CIDR rule: a host name rule never reaches into the host's networks, whatever its DNS says.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from warmshell.core.errors import InvalidArgumentError

__all__ = [
    "ANY",
    "BUNDLE_FILE",
    "CA_FILE",
    "HOST_BUNDLE",
    "PROXY_PORT",
    "PUBLIC_SUFFIXES",
    "SANDBOX_DIR",
    "SHARED_TRUST_DIR",
    "SYSTEM_BUNDLE",
    "SYSTEM_BUNDLE_COPY",
    "TRUST_LINKS",
    "URL_MARK",
    "Address",
    "Decision",
    "Policy",
    "Rule",
    "RuleKind",
    "compose",
    "internal",
    "parse_rule",
    "parse_rules",
    "parse_secret_host",
    "secret_hosts",
    "trust_environment",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# A small built-in list, not the Public Suffix List: the suffixes a wildcard is most often
# written over by mistake. `*.co.uk` would allow every British company; the full list (~9,000
# entries) is a dependency for a typo check.
PUBLIC_SUFFIXES = frozenset(
    {
        "com", "net", "org", "edu", "gov", "mil", "int", "io", "dev", "app", "ai", "co", "me", "info", "biz",
        "xyz", "cloud", "site", "online", "tech", "uk", "de", "fr", "jp", "cn", "au", "ca", "us", "ru", "in",
        "br", "nl", "eu", "example", "test", "local", "localhost", "internal", "co.uk", "org.uk", "ac.uk",
        "gov.uk", "com.au", "net.au", "org.au", "co.jp", "ne.jp", "com.cn", "com.br", "co.in", "co.nz",
        "github.io", "githubusercontent.com", "herokuapp.com", "appspot.com", "cloudfront.net",
        "amazonaws.com", "azurewebsites.net", "vercel.app", "netlify.app", "pages.dev", "workers.dev",
    }
)  # fmt: skip
# Where a local sandbox's agent listens on the sandbox's own loopback, relaying to the proxy.
PROXY_PORT = 3128
# Where a local sandbox sees the directory its proxy socket (and the CA it trusts) appear in.
SANDBOX_DIR = "/run/warmshell/egress"
# The CA bundle tools read when no variable names one (OpenSSL's default on Debian and Ubuntu).
# A local sandbox on the host's root sees there a symlink to `SYSTEM_BUNDLE_COPY` in SANDBOX_DIR,
# itself a symlink to the host's bundle (staged at `HOST_BUNDLE`) until an activation whose TLS
# is intercepted replaces it with a link to the bundle of the host's CAs and the gateway's
# (SHARED_TRUST_DIR).
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SYSTEM_BUNDLE_COPY = "system-ca-bundle.pem"
HOST_BUNDLE = "/etc/ssl/certs/.warmshell-host-ca-certificates.crt"
# The proxy's CA alone, and a bundle of the host's CAs and it: the files a sandbox whose TLS is
# intercepted trusts (a local sandbox's in SANDBOX_DIR; a pod's where its supervisor writes them).
CA_FILE = "ca.pem"
BUNDLE_FILE = "ca-bundle.pem"
# Where a local sandbox on the host's root reads both in its staged /etc (placed once per gateway,
# public, read-only): an intercepting activation links its egress directory's names here. Not in
# /etc/ssl/certs: Go trusts every file of that directory, and this CA is to be trusted only by a
# sandbox whose links or environment name it.
SHARED_TRUST_DIR = "/etc/ssl/warmshell-egress"
# A local sandbox's SANDBOX_DIR names for them, links into SHARED_TRUST_DIR made when the sandbox
# starts: public files, trusted only by a workload whose trust variables (`trust_environment`,
# given by an intercepting activation alone) name them.
TRUST_LINKS = {CA_FILE: f"{SHARED_TRUST_DIR}/{CA_FILE}", BUNDLE_FILE: f"{SHARED_TRUST_DIR}/{BUNDLE_FILE}"}
# A secret host written `api.example.com?` lets the value into the request's URL (path and query
# string) too, not only its headers: some APIs take their key only as `?key=`. Opt-in per host,
# because URLs end up in access logs, browser histories and error messages where headers do not.
URL_MARK = "?"
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_HOST_MAX = 253
_DIGITS = re.compile(r"^[0-9]{1,5}$")


class RuleKind(StrEnum):
    """What a rule names."""

    HOST = "host"
    WILDCARD = "wildcard"
    ADDRESS = "address"
    NETWORK = "network"
    ANY = "any"


@dataclass(frozen=True)
class Rule:
    """One parsed rule; `text` is what was written (shown in decisions)."""

    text: str
    kind: RuleKind
    host: str = ""  # HOST: the name; WILDCARD: the domain under the `*.`
    network: _Network | None = None  # ADDRESS (a /32 or /128) and NETWORK
    port: int | None = None

    def matches_name(self, host: str, port: int) -> bool:
        """Whether the rule matches a connection to `host` (a name or an IP literal) and `port`."""
        if self.port is not None and self.port != port:
            return False
        if self.kind is RuleKind.ANY:
            return True
        if self.kind is RuleKind.HOST:
            return host == self.host
        if self.kind is RuleKind.WILDCARD:
            return host.endswith("." + self.host)
        literal = _address(host)
        return literal is not None and self.network is not None and literal in self.network

    def matches_address(self, address: Address, port: int) -> bool:
        """Whether an IP or CIDR rule (only those: they name addresses) contains `address`."""
        if self.port is not None and self.port != port:
            return False
        return self.network is not None and address in self.network


ANY = Rule(text="*", kind=RuleKind.ANY)


@dataclass(frozen=True)
class Decision:
    """A verdict and the rule behind it (`rule` "" when no rule decided: nothing allowed it)."""

    allowed: bool
    rule: str = ""
    reason: str = ""

    def describe(self) -> str:
        """`allowed by RULE`, `denied by RULE` or `denied: REASON`."""
        if self.rule:
            return f"{'allowed' if self.allowed else 'denied'} by {self.rule}"
        return f"{'allowed' if self.allowed else 'denied'}: {self.reason}"


@dataclass(frozen=True)
class Policy:
    """Deny rules, and the allow lists a connection must each pass (none: nothing is allowed)."""

    allow: tuple[tuple[Rule, ...], ...] = ()
    deny: tuple[Rule, ...] = ()
    # Shown in the sandbox's Network condition.
    summary: str = field(default="", compare=False)

    @property
    def allows_anything(self) -> bool:
        """False when no connection can pass (the sandbox then gets no proxy at all)."""
        return bool(self.allow) and all(self.allow)

    def check_name(self, host: str, port: int) -> Decision:
        """The verdict on the name (or IP literal) and port the workload asked for. An allowed
        name must still pass `check_address` on every address it resolves to."""
        host = normalise_host(host)
        for rule in self.deny:
            if rule.matches_name(host, port):
                return Decision(False, rule.text)
        if not self.allows_anything:
            return Decision(False, reason="the policy allows no connection")
        matched = self._in_every_list(lambda rule: rule.matches_name(host, port))
        if matched is None:
            return Decision(False, reason=f"no rule allows {host}:{port}")
        return Decision(True, matched)

    def check_address(self, address: Address, port: int, *, host_local: bool = False) -> Decision:
        """The verdict on one resolved address: denied when a deny rule contains it, or when it is
        internal (or `host_local`: one of the host's own) and some allow list does not name it
        with an IP or CIDR rule."""
        for rule in self.deny:
            if rule.matches_address(address, port):
                return Decision(False, rule.text)
        if not (host_local or internal(address)):
            return Decision(True, reason="a public address")
        if not self.allows_anything:
            return Decision(False, reason="the policy allows no connection")
        named = self._in_every_list(lambda rule: rule.matches_address(address, port))
        if named is None:
            return Decision(False, reason=f"{address} is an address of the host or a private network")
        return Decision(True, named)

    def _in_every_list(self, matches: Callable[[Rule], bool]) -> str | None:
        """The first list's matching rule when every allow list has one; None when one has none."""
        texts = [next((rule.text for rule in rules if matches(rule)), None) for rules in self.allow]
        return None if None in texts else next(iter(texts), "")


def internal(address: Address) -> bool:
    """Loopback, link-local, private, reserved, multicast or unspecified: never reached by a name."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return internal(address.ipv4_mapped)
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_reserved
        or address.is_multicast
        or address.is_unspecified
    )


def normalise_host(host: str) -> str:
    """Lower case, without a trailing dot or IPv6 brackets."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _port(text: str, *, field: str) -> int:
    if not _DIGITS.match(text) or not 1 <= int(text) <= 65535:
        raise InvalidArgumentError(field, f"port {text!r} is not a number from 1 to 65535")
    return int(text)


def _split_port(text: str, *, field: str) -> tuple[str, int | None]:
    if text.startswith("["):  # [v6] or [v6]:port
        close = text.find("]")
        rest = text[close + 1 :]
        literal = _address(text[1:close]) if close > 0 else None
        if not isinstance(literal, ipaddress.IPv6Address) or (rest and not rest.startswith(":")):
            raise InvalidArgumentError(field, f"{text!r} is not HOST[:PORT] ([IPv6]:PORT for an IPv6 address)")
        return text[1:close], _port(rest[1:], field=field) if rest else None
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, _port(port, field=field)
    return text, None  # no port, or a bare IPv6 address (more than one colon)


def _check_name(name: str, text: str, *, field: str) -> None:
    labels = name.split(".")
    if len(name) > _HOST_MAX or not all(_LABEL.match(label) for label in labels):
        raise InvalidArgumentError(
            field, f"{text!r} is not HOST[:PORT], *.DOMAIN[:PORT], an IP address or a CIDR (bad host name {name!r})"
        )


# Cached by content: every create that asks for rules parses them twice (its validation, then
# the policy at activation), 50-60 us a rule through `ipaddress`; with them a warm create with
# one IP rule cost the gateway 0.2-0.8 ms more CPU than one without, parsed once 0-0.2 ms, and
# creates mostly repeat a few rule lists. A Rule is frozen, so sharing one is safe; an error is
# raised, never cached.
@functools.lru_cache(maxsize=1024)
def parse_rule(text: str, *, field: str) -> Rule:
    """One rule; InvalidArgumentError naming `field` when it breaks a rule of the syntax."""
    cleaned = text.strip()
    if not cleaned:
        raise InvalidArgumentError(field, "must not be empty")
    if "://" in cleaned or "/" in cleaned.partition("/")[2]:
        raise InvalidArgumentError(field, f"{text!r} is not HOST[:PORT] (a rule names a host, never a URL)")
    spec, port = _split_port(cleaned, field=field)
    if "/" in spec:
        try:
            network = ipaddress.ip_network(spec, strict=True)
        except ValueError as exc:
            raise InvalidArgumentError(field, f"{text!r} is not a CIDR: {exc}") from None
        return Rule(text=cleaned, kind=RuleKind.NETWORK, network=network, port=port)
    literal = _address(spec)
    if literal is not None:
        return Rule(text=cleaned, kind=RuleKind.ADDRESS, network=ipaddress.ip_network(literal), port=port)
    name = spec.lower().rstrip(".")
    if name.startswith("*."):
        domain = name[2:]
        _check_name(domain, text, field=field)
        if "." not in domain or domain in PUBLIC_SUFFIXES:
            raise InvalidArgumentError(field, f"{text!r} is a wildcard over a public suffix ({domain!r})")
        return Rule(text=cleaned, kind=RuleKind.WILDCARD, host=domain, port=port)
    _check_name(name, text, field=field)
    return Rule(text=cleaned, kind=RuleKind.HOST, host=name, port=port)


def parse_rules(texts: Iterable[str], *, field: str) -> tuple[Rule, ...]:
    """Every rule of a list; an error names the entry (`spec.network.allow[2]`)."""
    return tuple(parse_rule(text, field=f"{field}[{index}]") for index, text in enumerate(texts))


def parse_secret_host(text: str, *, field: str) -> tuple[Rule, bool]:
    """One host of a secret: a rule (not a CIDR: a secret goes to a host, not a network) and
    whether its trailing `?` (`URL_MARK`) lets the value into the URL too."""
    try:
        return _secret_host(text)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(field, exc.rule) from None


# Cached by the text alone (the field only names an error, which is raised, never cached): a
# create's secret host is parsed by its validation, then again by each activation that makes its
# placeholder; the second is now a lookup.
@functools.lru_cache(maxsize=1024)
def _secret_host(text: str) -> tuple[Rule, bool]:
    cleaned = text.strip()
    in_url = cleaned.endswith(URL_MARK)
    rule = parse_rule(cleaned.removesuffix(URL_MARK), field="")
    if rule.kind is RuleKind.NETWORK:
        raise InvalidArgumentError("", f"{rule.text!r} is a network, not a host")
    return rule, in_url


def secret_hosts(hosts: Mapping[str, Sequence[str]], secrets: Mapping[str, str], *, field: str) -> dict[str, list[str]]:
    """A request's secret -> hosts, checked: each names one of its secrets, each host is a
    secret host (`parse_secret_host`; an error names `spec.secret_hosts.API_KEY[0]`)."""
    checked: dict[str, list[str]] = {}
    for name, rules in sorted(hosts.items()):
        if name not in secrets:
            raise InvalidArgumentError(f"{field}.{name}", f"there is no secret named {name!r}")
        if not rules:
            raise InvalidArgumentError(f"{field}.{name}", "names no host")
        for index, rule in enumerate(rules):
            parse_secret_host(rule, field=f"{field}.{name}[{index}]")
        checked[name] = [rule.strip() for rule in rules]
    return checked


def trust_environment(directory: str = SANDBOX_DIR) -> dict[str, str]:
    """What makes OpenSSL, Python (ssl, requests), curl, git and Node trust the proxy's CA
    besides the host's, the files being in `directory`: the bundle of both, and the CA alone
    for Node (which adds it to its own)."""
    bundle = f"{directory}/{BUNDLE_FILE}"
    env = dict.fromkeys(("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"), bundle)
    return env | {"NODE_EXTRA_CA_CERTS": f"{directory}/{CA_FILE}"}


def compose(
    *,
    default: str,
    gateway_deny: Sequence[Rule] = (),
    profile_allow: Sequence[Rule] | None = None,
    profile_deny: Sequence[Rule] = (),
    request_allow: Sequence[Rule] | None = None,
    request_deny: Sequence[Rule] = (),
    requests_may_widen: bool = False,
) -> Policy:
    """A sandbox's policy: the profile's allow list (None: the gateway's `default`, "all" or
    "none"), narrowed by the request's (None: not narrowed) — or replaced by it when the gateway
    lets requests widen. Every deny list applies."""
    base: tuple[Rule, ...] = tuple(profile_allow) if profile_allow is not None else ((ANY,) if default == "all" else ())
    allow: list[tuple[Rule, ...]] = [base]
    if request_allow is not None:
        allow = [tuple(request_allow)] if requests_may_widen else [base, tuple(request_allow)]
    deny = (*gateway_deny, *profile_deny, *request_deny)
    lists = "; ".join(", ".join(rule.text for rule in rules) or "nothing" for rules in allow)
    summary = f"allow {lists}" + (f"; deny {', '.join(rule.text for rule in deny)}" if deny else "")
    return Policy(allow=tuple(allow), deny=deny, summary=summary)
