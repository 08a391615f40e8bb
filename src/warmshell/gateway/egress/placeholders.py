"""Placeholder secrets (pure): a secret meant for some hosts only reaches the workload as a
random `wsp_…` token; the egress proxy puts the value back in the headers of requests to
those hosts (and in their URL, for a host written with `egress.URL_MARK`), and refuses a
request that carries the token anywhere else."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import quote

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
    url_hosts: tuple[egress.Rule, ...] = ()  # those of `hosts` whose URL may carry it too

    def for_host(self, host: str, port: int) -> bool:
        """Whether a request to `host`:`port` may carry the value."""
        host = egress.normalise_host(host)
        return any(rule.matches_name(host, port) for rule in self.hosts)

    def for_url(self, host: str, port: int) -> bool:
        """Whether the URL of a request to `host`:`port` may carry the value."""
        host = egress.normalise_host(host)
        return any(rule.matches_name(host, port) for rule in self.url_hosts)


class Leak(Exception):
    """A placeholder in a request to a host its secret is not for."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def make(
    values: Mapping[str, str], hosts: Mapping[str, Sequence[str]], token: Callable[[str], str] | None = None
) -> list[Placeholder]:
    """A fresh placeholder for each secret that names hosts (unique per sandbox and secret:
    made again at each activation); `token` names a secret's token (default: random), for a
    proxy that must make the same tokens again on another replica."""
    made = []
    for name, texts in sorted(hosts.items()):
        if name not in values:
            continue
        parsed = [
            egress.parse_secret_host(text, field=f"spec.secret_hosts.{name}[{index}]")
            for index, text in enumerate(texts)
        ]
        made.append(
            Placeholder(
                name=name,
                token=token(name) if token is not None else PREFIX + secrets.token_urlsafe(24),
                value=values[name],
                hosts=tuple(rule for rule, _ in parsed),
                url_hosts=tuple(rule for rule, in_url in parsed if in_url),
            )
        )
    return made


def swap(head: Head, placeholders: Iterable[Placeholder]) -> Head:
    """`head` with each placeholder for its host replaced by the value in the header values (and
    in the path and query string, percent-encoded, where its host allows the URL); Leak when
    any placeholder is in it (request line included) and its secret is not for this host. A
    placeholder in the URL of its own host that does not allow the URL stays as it is: the
    upstream sees a token worth nothing."""
    headers, path = head.headers, head.path
    raw = b" ".join([path.encode(), *(name + b":" + value for name, value in headers)])
    for placeholder in placeholders:
        token = placeholder.token.encode()
        if token not in raw and token not in head.host.encode():
            continue
        if not placeholder.for_host(head.host, head.port):
            raise Leak(placeholder.name)
        value = placeholder.value.encode()
        headers = tuple((name, content.replace(token, value)) for name, content in headers)
        if placeholder.for_url(head.host, head.port):
            path = path.replace(placeholder.token, quote(placeholder.value, safe=""))
    return replace(head, headers=headers, path=path)
