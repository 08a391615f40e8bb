"""Placeholder secrets (pure): a secret meant for some hosts only reaches the workload as a
random `wsp_…` token; the egress proxy puts the value back in the headers of requests to
those hosts, and refuses a request that carries the token anywhere else."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from warmshell.core import egress
from warmshell.gateway.egress.heads import Head

__all__ = ["PREFIX", "Leak", "Placeholder", "make", "swap"]

PREFIX = "wsp_"


@dataclass(frozen=True)
class Placeholder:
    """One secret of one sandbox: what the workload sees, the value, the hosts it is for."""

    name: str
    token: str
    value: str = field(repr=False)
    hosts: tuple[egress.Rule, ...]

    def for_host(self, host: str, port: int) -> bool:
        """Whether a request to `host`:`port` may carry the value."""
        host = egress.normalise_host(host)
        return any(rule.matches_name(host, port) for rule in self.hosts)


class Leak(Exception):
    """A placeholder in a request to a host its secret is not for."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def make(values: Mapping[str, str], hosts: Mapping[str, Sequence[str]]) -> list[Placeholder]:
    """A fresh placeholder for each secret that names hosts (unique per sandbox and secret:
    made again at each activation)."""
    return [
        Placeholder(
            name=name,
            token=PREFIX + secrets.token_urlsafe(24),
            value=values[name],
            hosts=egress.parse_rules(rules, field=f"spec.secret_hosts.{name}"),
        )
        for name, rules in sorted(hosts.items())
        if name in values
    ]


def swap(head: Head, placeholders: Iterable[Placeholder]) -> Head:
    """`head` with each placeholder for its host replaced by the value in the header values;
    Leak when any placeholder is in it (request line included) and its secret is not for this
    host. A placeholder in the request line of its own host stays as it is."""
    headers = head.headers
    raw = b" ".join([head.path.encode(), *(name + b":" + value for name, value in headers)])
    for placeholder in placeholders:
        token = placeholder.token.encode()
        if token not in raw and token not in head.host.encode():
            continue
        if not placeholder.for_host(head.host, head.port):
            raise Leak(placeholder.name)
        value = placeholder.value.encode()
        headers = tuple((name, content.replace(token, value)) for name, content in headers)
    return replace(head, headers=headers)
