"""Sandbox lifetimes: the TTL and idle timeout a create is granted (request, else default, within
the gateway's maximum), a refreshed TTL, and whether a lifetime has ended. Pure functions over
plain values; the gateway's expiry reconciler reads the clock and deletes what is due.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import Lifetime

__all__ = ["Limits", "Requested", "due", "granted", "refreshed"]


@dataclass(frozen=True)
class Limits:
    """The gateway's rules: defaults for a create that sets nothing, maxima (0 = no maximum)."""

    default_ttl_seconds: int = 0
    max_ttl_seconds: int = 0
    default_idle_timeout_seconds: int = 0
    max_idle_timeout_seconds: int = 0
    pause_ttl_seconds: int = 7 * 86400  # a Paused sandbox's life when its pause asks for none


@dataclass(frozen=True)
class Requested:
    """What a create asked for; None = not set (the default applies), 0 = no limit."""

    ttl_seconds: int | None = None
    idle_timeout_seconds: int | None = None


def _bounded(value: int, maximum: int, field: str) -> int:
    if value < 0:
        raise InvalidArgumentError(field, "must not be negative")
    if maximum and value == 0:
        raise InvalidArgumentError(
            field, f"0 (no limit) is not allowed: the gateway's maximum is {maximum} s ([lifetimes] max_{field})"
        )
    if maximum and value > maximum:
        raise InvalidArgumentError(
            field, f"{value} s is beyond the gateway's maximum of {maximum} s ([lifetimes] max_{field})"
        )
    return value


def _pick(asked: int | None, profile: int | None, default: int, maximum: int) -> int:
    """The request's value, else the profile's (held to the maximum: an operator's profile is not
    refused like a request), else the gateway's default."""
    if asked is not None:
        return asked
    if profile is not None:
        return maximum if maximum and (profile == 0 or profile > maximum) else profile
    return default


def granted(requested: Requested, limits: Limits, *, now_ms: int, profile: Requested | None = None) -> Lifetime:
    """The lifetime of a new sandbox: what the request set, else its pool profile's default, else
    the gateway's (InvalidArgumentError names the field and the rule)."""
    profile = profile or Requested()
    ttl = _pick(requested.ttl_seconds, profile.ttl_seconds, limits.default_ttl_seconds, limits.max_ttl_seconds)
    idle = _pick(
        requested.idle_timeout_seconds,
        profile.idle_timeout_seconds,
        limits.default_idle_timeout_seconds,
        limits.max_idle_timeout_seconds,
    )
    ttl = _bounded(ttl, limits.max_ttl_seconds, "ttl_seconds")
    idle = _bounded(idle, limits.max_idle_timeout_seconds, "idle_timeout_seconds")
    return Lifetime(
        ttl_seconds=ttl,
        expires_at_ms=now_ms + ttl * 1000 if ttl else 0,
        idle_timeout_seconds=idle,
        last_activity_ms=now_ms,
    )


def refreshed(lifetime: Lifetime, ttl_seconds: int, limits: Limits, *, now_ms: int) -> Lifetime:
    """The lifetime after RefreshTtl: `ttl_seconds` from now (at least 1, at most the maximum)."""
    if ttl_seconds < 1:
        raise InvalidArgumentError("ttl_seconds", "must be at least 1")
    ttl = _bounded(ttl_seconds, limits.max_ttl_seconds, "ttl_seconds")
    return lifetime.model_copy(update={"ttl_seconds": ttl, "expires_at_ms": now_ms + ttl * 1000})


def due(
    lifetime: Lifetime, *, last_activity_ms: int, now_ms: int, exited_at_ms: int = 0, exited_retention_seconds: int = 0
) -> str | None:
    """Why the lifetime has ended ("TtlExpired", "IdleTimeout", "ExitedRetention"), or None
    while it lasts. `last_activity_ms` is the latest exec activity known (stored or in memory);
    `exited_at_ms` when the workload exited (0: it has not), kept `exited_retention_seconds`
    after that (0: as long as the rest allows)."""
    if lifetime.expires_at_ms and now_ms >= lifetime.expires_at_ms:
        return "TtlExpired"
    if exited_at_ms and exited_retention_seconds and now_ms - exited_at_ms >= exited_retention_seconds * 1000:
        return "ExitedRetention"
    if lifetime.idle_timeout_seconds:
        last = max(last_activity_ms, lifetime.last_activity_ms)
        if now_ms - last >= lifetime.idle_timeout_seconds * 1000:
            return "IdleTimeout"
    return None
