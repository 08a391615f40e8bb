"""The egress policy: rule syntax (errors name the entry), matching, and how layers compose."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import egress
from warmshell.core.errors import InvalidArgumentError

_label = st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True)
_domain = st.lists(_label, min_size=2, max_size=4).map(".".join).filter(lambda d: d not in egress.PUBLIC_SUFFIXES)
_port = st.integers(1, 65535)


def _policy(allow: Sequence[str], deny: Sequence[str] = (), *, default: str = "none") -> egress.Policy:
    return egress.compose(
        default=default,
        request_allow=egress.parse_rules(allow, field="allow"),
        request_deny=egress.parse_rules(deny, field="deny"),
        requests_may_widen=True,
    )


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("", "must not be empty"),
        ("pypi.example:0", "port '0' is not a number from 1 to 65535"),
        ("pypi.example:65536", "port '65536' is not a number from 1 to 65535"),
        ("pypi.example:https", "port 'https' is not a number from 1 to 65535"),
        ("*.com", "a wildcard over a public suffix ('com')"),
        ("*.co.uk:443", "a wildcard over a public suffix ('co.uk')"),
        ("*.example", "a wildcard over a public suffix ('example')"),
        ("https://pypi.example", "a rule names a host, never a URL"),
        ("bad_host", "bad host name 'bad_host'"),
        ("10.0.0.1/8", "has host bits set"),
        ("[pypi.example]:443", "[IPv6]:PORT for an IPv6 address"),
    ],
)
def test_a_bad_rule_is_refused_naming_its_entry(text: str, rule: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        egress.parse_rules(["ok.example", "ok.example:443", text], field="spec.network.allow")
    assert caught.value.field == "spec.network.allow[2]"
    assert rule in caught.value.rule


@pytest.mark.parametrize(
    ("text", "kind", "port"),
    [
        ("Pypi.Example.", egress.RuleKind.HOST, None),
        ("*.githubusercontent.example:443", egress.RuleKind.WILDCARD, 443),
        ("127.0.0.2:8080", egress.RuleKind.ADDRESS, 8080),
        ("::1", egress.RuleKind.ADDRESS, None),
        ("[::1]:443", egress.RuleKind.ADDRESS, 443),
        ("10.0.0.0/8:22", egress.RuleKind.NETWORK, 22),
        ("fd00::/8", egress.RuleKind.NETWORK, None),
    ],
)
def test_each_rule_syntax_parses(text: str, kind: egress.RuleKind, port: int | None) -> None:
    rule = egress.parse_rule(text, field="f")
    assert (rule.kind, rule.port) == (kind, port)


def test_a_rule_parsed_again_is_the_same_rule_and_an_error_names_each_entry_again() -> None:
    """Rules are cached by content (each create parses its rules twice); errors are not."""
    first = egress.parse_rules(["127.0.0.9:443", "cache.example"], field="spec.network.allow")
    assert egress.parse_rules(["127.0.0.9:443", "cache.example"], field="spec.network.allow") == first
    assert egress.parse_rule("127.0.0.9:443", field="spec.network.allow[0]") is first[0]
    for field in ("spec.network.allow", "network.deny", "spec.network.allow"):
        with pytest.raises(InvalidArgumentError) as caught:
            egress.parse_rules(["ok.example", "bad_host"], field=field)
        assert caught.value.field == f"{field}[1]"


def test_a_secret_host_parsed_again_is_the_same_and_an_error_names_each_field_again() -> None:
    """Secret hosts are cached by their text (validation, then each activation); errors are not."""
    first = egress.parse_secret_host(" api.example.com:443? ", field="spec.secret_hosts.K[0]")
    assert first == (egress.parse_rule("api.example.com:443", field="x"), True)
    assert egress.parse_secret_host(" api.example.com:443? ", field="other") is first
    for field in ("spec.secret_hosts.A[0]", "activation.secret_hosts.B[1]"):
        for bad, rule in (("10.0.0.0/8", "is a network, not a host"), ("", "must not be empty")):
            with pytest.raises(InvalidArgumentError) as caught:
                egress.parse_secret_host(bad, field=field)
            assert caught.value.field == field
            assert rule in caught.value.rule


@given(domain=_domain, sub=st.lists(_label, min_size=1, max_size=3).map(".".join), port=_port)
def test_a_wildcard_matches_every_subdomain_and_not_the_domain(domain: str, sub: str, port: int) -> None:
    policy = _policy([f"*.{domain}"])
    assert policy.check_name(f"{sub}.{domain}", port).allowed
    assert not policy.check_name(domain, port).allowed
    assert not policy.check_name(f"{sub}{domain}", port).allowed  # "evilexample.org" is not under it


@given(domain=_domain, port=_port, other=_port)
def test_a_port_limits_the_rule_to_that_port(domain: str, port: int, other: int) -> None:
    policy = _policy([f"{domain}:{port}"])
    assert policy.check_name(domain.upper() + ".", port) == egress.Decision(True, f"{domain}:{port}")
    assert policy.check_name(domain, other).allowed is (other == port)


@given(domain=_domain, port=_port)
def test_deny_wins_over_allow(domain: str, port: int) -> None:
    policy = _policy([f"*.{domain}", domain], [f"api.{domain}"])
    assert policy.check_name(f"api.{domain}", port) == egress.Decision(False, f"api.{domain}")
    assert policy.check_name(f"www.{domain}", port).allowed


@given(address=st.ip_addresses(), port=_port)
def test_an_internal_address_needs_an_ip_or_cidr_rule(address: egress.Address, port: int) -> None:
    by_name = _policy(["service.example"], default="all")
    if egress.internal(address):
        assert not by_name.check_address(address, port).allowed
        assert _policy([str(ipaddress.ip_network(address))]).check_address(address, port).allowed
    else:
        assert by_name.check_address(address, port).allowed


def test_a_host_local_address_is_refused_like_loopback() -> None:
    public = ipaddress.ip_address("93.184.216.34")
    policy = _policy(["service.example"])
    assert policy.check_address(public, 443).allowed
    assert not policy.check_address(public, 443, host_local=True).allowed


@given(domain=_domain, port=_port)
def test_a_request_only_narrows_unless_the_gateway_lets_it_widen(domain: str, port: int) -> None:
    profile = egress.parse_rules([f"*.{domain}"], field="allow")
    request = egress.parse_rules([f"api.{domain}", "elsewhere.example"], field="allow")
    narrowed = egress.compose(default="none", profile_allow=profile, request_allow=request)
    assert narrowed.check_name(f"api.{domain}", port).allowed
    assert not narrowed.check_name(f"www.{domain}", port).allowed
    assert not narrowed.check_name("elsewhere.example", port).allowed
    widened = egress.compose(default="none", profile_allow=profile, request_allow=request, requests_may_widen=True)
    assert widened.check_name("elsewhere.example", port).allowed


def test_the_gateway_default_applies_without_a_profile_list() -> None:
    none = egress.compose(default="none")
    assert not none.allows_anything
    assert none.check_name("pypi.example", 443) == egress.Decision(False, reason="the policy allows no connection")
    everything = egress.compose(default="all", gateway_deny=egress.parse_rules(["bad.example"], field="d"))
    assert everything.check_name("pypi.example", 443).allowed
    assert not everything.check_name("bad.example", 443).allowed
    assert everything.summary == "allow *; deny bad.example"
