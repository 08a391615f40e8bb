"""Fault injection for tests: latency, failing requests, dropped watches, compaction, outages.

Rules are matched against each request's verb, resource and user, so a test can slow down or
break only what the code under test does (say, the ``kubesim-user``'s creates of sandboxclaims)
while controllers running as ``admin`` carry on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kubesim.apiserver import errors

_REASONS = {
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    429: ("TooManyRequests", "Too many requests, please try again later."),
    409: ("Conflict", "Operation cannot be fulfilled: injected conflict"),
    504: ("Timeout", "Timeout: request did not complete within requested timeout"),
}


@dataclass
class Match:
    """Which requests a rule applies to; ``None`` matches anything."""

    verb: str | None = None
    resource: str | None = None  # plural, or "plural/subresource"
    user: str | None = None

    def hits(self, verb: str, resource: str, user: str) -> bool:
        """Whether a request is covered."""
        if self.verb is not None and self.verb != verb:
            return False
        if self.resource is not None and self.resource != resource and self.resource != resource.split("/")[0]:
            return False
        return self.user is None or self.user == user


@dataclass
class Latency:
    """Added delay for matching requests."""

    match: Match
    seconds: float


@dataclass
class Failure:
    """Fail the next ``remaining`` matching requests with ``code``."""

    match: Match
    code: int
    remaining: int
    retry_after: int | None = None


@dataclass
class Faults:
    """The active fault rules of one server."""

    latencies: list[Latency] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    unavailable_until: float = 0.0

    def add_latency(
        self, seconds: float, *, verb: str | None = None, resource: str | None = None, user: str | None = None
    ) -> None:
        """Delay matching requests by ``seconds``."""
        self.latencies.append(Latency(Match(verb, resource, user), seconds))

    def fail_next(
        self,
        n: int,
        *,
        code: int = 500,
        verb: str | None = None,
        resource: str | None = None,
        user: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Fail the next ``n`` matching requests with ``code`` (429 carries Retry-After)."""
        if code == 429 and retry_after is None:
            retry_after = 1
        self.failures.append(Failure(Match(verb, resource, user), code, n, retry_after))

    def make_unavailable(self, seconds: float) -> None:
        """Answer 503 to every API request for ``seconds``."""
        self.unavailable_until = time.monotonic() + seconds

    def clear(self) -> None:
        """Remove every rule."""
        self.latencies.clear()
        self.failures.clear()
        self.unavailable_until = 0.0

    def delay_for(self, verb: str, resource: str, user: str) -> float:
        """Total injected latency for a request."""
        return sum(rule.seconds for rule in self.latencies if rule.match.hits(verb, resource, user))

    def check(self, verb: str, resource: str, user: str) -> None:
        """Raise the injected error for this request, if any rule fires."""
        if self.unavailable_until and time.monotonic() < self.unavailable_until:
            raise errors.ApiError(503, *_REASONS[503], headers={"Retry-After": "1"})
        for rule in self.failures:
            if rule.remaining > 0 and rule.match.hits(verb, resource, user):
                rule.remaining -= 1
                reason, message = _REASONS.get(rule.code, ("InternalError", "injected fault"))
                headers = {"Retry-After": str(rule.retry_after)} if rule.retry_after is not None else {}
                details: dict[str, Any] | None = (
                    {"retryAfterSeconds": rule.retry_after} if rule.retry_after is not None else None
                )
                raise errors.ApiError(rule.code, reason, message, details=details, headers=headers)
        self.failures = [r for r in self.failures if r.remaining > 0]
