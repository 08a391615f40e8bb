"""Placeholder secrets: swapped in the headers of requests to their hosts, refused elsewhere."""

from __future__ import annotations

import pytest

from warmshell.core import egress
from warmshell.core.errors import InvalidArgumentError
from warmshell.gateway.egress import heads, placeholders


def _head(target: str, *headers: bytes) -> heads.Head:
    lines = b"\r\n".join([f"GET {target} HTTP/1.1".encode(), *headers])
    return heads.parse_head(lines + b"\r\n\r\n")


def test_each_secret_gets_its_own_placeholder() -> None:
    made = placeholders.make({"A": "1", "B": "2", "C": "3"}, {"A": ["a.example"], "B": ["b.example"]})
    assert [p.name for p in made] == ["A", "B"]
    assert all(p.token.startswith("wsp_") and len(p.token) > 30 for p in made)
    assert made[0].token != made[1].token
    again = placeholders.make({"A": "1"}, {"A": ["a.example"]})
    assert again[0].token != made[0].token


def test_a_placeholder_is_swapped_only_for_its_host() -> None:
    (key,) = placeholders.make({"KEY": "real-value"}, {"KEY": ["api.example", "*.api.example:443"]})
    header = b"Authorization: Bearer " + key.token.encode()
    swapped = placeholders.swap(_head("http://api.example/v1", header), [key])
    assert swapped.headers == ((b"Authorization", b"Bearer real-value"),)
    assert placeholders.swap(_head("http://eu.api.example:443/", header), [key]).headers[0][1] == b"Bearer real-value"
    for elsewhere in ("http://other.example/", "http://eu.api.example:80/", f"http://other.example/?k={key.token}"):
        with pytest.raises(placeholders.Leak) as caught:
            placeholders.swap(_head(elsewhere, header if "?" not in elsewhere else b"Accept: */*"), [key])
        assert caught.value.name == "KEY"


def test_a_request_without_placeholders_is_left_alone() -> None:
    (key,) = placeholders.make({"KEY": "v"}, {"KEY": ["api.example"]})
    head = _head("http://other.example/", b"Accept: */*")
    assert placeholders.swap(head, [key]) == head


@pytest.mark.parametrize(
    ("hosts", "field", "rule"),
    [
        ({"MISSING": ["a.example"]}, "spec.secret_hosts.MISSING", "there is no secret named 'MISSING'"),
        ({"KEY": []}, "spec.secret_hosts.KEY", "names no host"),
        ({"KEY": ["a.example", "*.com"]}, "spec.secret_hosts.KEY[1]", "a wildcard over a public suffix"),
        ({"KEY": ["10.0.0.0/8"]}, "spec.secret_hosts.KEY[0]", "is a network, not a host"),
    ],
)
def test_bad_secret_hosts_name_the_field(hosts: dict[str, list[str]], field: str, rule: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        egress.secret_hosts(hosts, {"KEY": "v"}, field="spec.secret_hosts")
    assert caught.value.field == field
    assert rule in caught.value.rule
