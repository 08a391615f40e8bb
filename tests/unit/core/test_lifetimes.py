"""The lifetime rules: defaults, maxima (each refusal names the field and the rule), refreshes,
and when a lifetime has ended."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import lifetimes
from warmshell.core.config import LifetimesConfig, load_config
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import Lifetime

NOW = 1_000_000
LIMITS = lifetimes.Limits(
    default_ttl_seconds=60, max_ttl_seconds=3600, default_idle_timeout_seconds=300, max_idle_timeout_seconds=600
)


def test_unset_values_take_the_defaults_and_zero_means_none() -> None:
    granted = lifetimes.granted(lifetimes.Requested(), LIMITS, now_ms=NOW)
    assert granted == Lifetime(
        ttl_seconds=60, expires_at_ms=NOW + 60_000, idle_timeout_seconds=300, last_activity_ms=NOW
    )
    free = lifetimes.granted(lifetimes.Requested(0, None), lifetimes.Limits(), now_ms=NOW)
    assert (free.ttl_seconds, free.expires_at_ms) == (0, 0)


@pytest.mark.parametrize(
    ("requested", "field", "rule"),
    [
        (
            lifetimes.Requested(ttl_seconds=3601),
            "ttl_seconds",
            "3601 s is beyond the gateway's maximum of 3600 s ([lifetimes] max_ttl_seconds)",
        ),
        (
            lifetimes.Requested(ttl_seconds=0),
            "ttl_seconds",
            "0 (no limit) is not allowed: the gateway's maximum is 3600 s ([lifetimes] max_ttl_seconds)",
        ),
        (lifetimes.Requested(ttl_seconds=-1), "ttl_seconds", "must not be negative"),
        (
            lifetimes.Requested(idle_timeout_seconds=601),
            "idle_timeout_seconds",
            "601 s is beyond the gateway's maximum of 600 s ([lifetimes] max_idle_timeout_seconds)",
        ),
    ],
)
def test_refusals_name_the_field_and_the_rule(requested: lifetimes.Requested, field: str, rule: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        lifetimes.granted(requested, LIMITS, now_ms=NOW)
    assert (caught.value.field, caught.value.rule) == (field, rule)


def test_refresh_counts_from_now_within_the_maximum() -> None:
    start = lifetimes.granted(lifetimes.Requested(ttl_seconds=10), LIMITS, now_ms=NOW)
    later = lifetimes.refreshed(start, 600, LIMITS, now_ms=NOW + 5_000)
    assert (later.ttl_seconds, later.expires_at_ms) == (600, NOW + 5_000 + 600_000)
    for bad in (0, 3601):
        with pytest.raises(InvalidArgumentError) as caught:
            lifetimes.refreshed(start, bad, LIMITS, now_ms=NOW)
        assert caught.value.field == "ttl_seconds"


def test_due_reports_ttl_then_idle() -> None:
    lifetime = Lifetime(ttl_seconds=10, expires_at_ms=NOW + 10_000, idle_timeout_seconds=3, last_activity_ms=NOW)
    assert lifetimes.due(lifetime, last_activity_ms=0, now_ms=NOW + 2_999) is None
    assert lifetimes.due(lifetime, last_activity_ms=0, now_ms=NOW + 3_000) == "IdleTimeout"
    assert lifetimes.due(lifetime, last_activity_ms=NOW + 2_000, now_ms=NOW + 4_000) is None  # activity in memory
    assert lifetimes.due(lifetime, last_activity_ms=NOW + 9_000, now_ms=NOW + 10_000) == "TtlExpired"


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**7))
def test_a_lifetime_without_limits_never_ends(ttl_zero: int, activity: int, now: int) -> None:
    assert lifetimes.due(Lifetime(last_activity_ms=ttl_zero), last_activity_ms=activity, now_ms=now) is None


def test_config_defaults_must_fit_the_maxima() -> None:
    config = load_config(None, {"lifetimes.max_ttl_seconds": 600, "lifetimes.default_ttl_seconds": 300})
    assert (config.lifetimes.default_ttl_seconds, config.lifetimes.max_ttl_seconds) == (300, 600)
    with pytest.raises(InvalidArgumentError) as caught:
        load_config(None, {"lifetimes.max_ttl_seconds": 600})
    assert "default_ttl_seconds must be between 1 and max_ttl_seconds (600)" in str(caught.value)


def test_a_pool_profile_default_sits_between_the_request_and_the_gateway() -> None:
    profile = lifetimes.Requested(ttl_seconds=120, idle_timeout_seconds=30)
    served = lifetimes.granted(lifetimes.Requested(), LIMITS, now_ms=NOW, profile=profile)
    assert (served.ttl_seconds, served.idle_timeout_seconds) == (120, 30)
    asked = lifetimes.granted(lifetimes.Requested(ttl_seconds=10), LIMITS, now_ms=NOW, profile=profile)
    assert (asked.ttl_seconds, asked.idle_timeout_seconds) == (10, 30)
    # An operator's profile beyond the maximum (or unlimited) is held to it, not refused.
    held = lifetimes.granted(lifetimes.Requested(), LIMITS, now_ms=NOW, profile=lifetimes.Requested(0, 9999))
    assert (held.ttl_seconds, held.idle_timeout_seconds) == (3600, 600)


def test_a_profile_states_its_lifetime_defaults() -> None:
    from warmshell.core.profiles import ProfileError, parse_profile

    text = 'version = 1\nworkspace = "default"\nreplicas = 1\n[lifetime]\nttl_seconds = 600\n'
    profile = parse_profile(text, name="p", source="p.toml", max_replicas=4)
    assert (profile.ttl_seconds, profile.idle_timeout_seconds) == (600, None)
    with pytest.raises(ProfileError) as caught:
        parse_profile(text.replace("600", '"soon"'), name="p", source="p.toml", max_replicas=4)
    assert str(caught.value) == "p.toml:5: lifetime.ttl_seconds: must be a whole number of seconds (0 = no limit)"
    with pytest.raises(ProfileError, match=r"lifetime.ttl: unknown key"):
        parse_profile(text.replace("ttl_seconds", "ttl"), name="p", source="p.toml", max_replicas=4)
    # The API carries lifetimes as uint32: beyond that the pool could not serve it, so the
    # profile is refused where it is read, not when a pool member is made.
    longest = parse_profile(text.replace("600", str(2**32 - 1)), name="p", source="p.toml", max_replicas=4)
    assert longest.ttl_seconds == 2**32 - 1
    for key in ("ttl_seconds", "idle_timeout_seconds"):
        too_long = text.replace("ttl_seconds = 600", f"{key} = {2**32}")
        with pytest.raises(ProfileError) as caught:
            parse_profile(too_long, name="p", source="p.toml", max_replicas=4)
        assert str(caught.value) == (
            f"p.toml:5: lifetime.{key}: 4294967296 is more than 4294967295 s, the most the API carries (0 = no limit)"
        )


def test_an_exited_sandbox_is_due_after_its_retention_whatever_its_ttl() -> None:
    lifetime = Lifetime(ttl_seconds=86400, expires_at_ms=NOW + 86_400_000, last_activity_ms=NOW)
    exited = NOW + 5_000

    def due(now: int, retention: int) -> str | None:
        return lifetimes.due(
            lifetime, last_activity_ms=0, now_ms=now, exited_at_ms=exited, exited_retention_seconds=retention
        )

    assert due(exited + 599_999, 600) is None
    assert due(exited + 600_000, 600) == "ExitedRetention"
    assert due(exited + 86_000_000, 0) is None  # no retention: the TTL alone
    running = lifetimes.due(lifetime, last_activity_ms=0, now_ms=NOW + 10**6, exited_retention_seconds=600)
    assert running is None  # not exited: retention does not apply


def test_the_gateway_default_is_finite_and_never_is_an_explicit_choice() -> None:
    config = LifetimesConfig()
    assert (config.default_ttl_seconds, config.max_ttl_seconds) == (3600, 86400)
    assert config.exited_retention_seconds > 0
    finite = lifetimes.Limits(default_ttl_seconds=config.default_ttl_seconds, max_ttl_seconds=config.max_ttl_seconds)
    assert lifetimes.granted(lifetimes.Requested(), finite, now_ms=NOW).expires_at_ms == NOW + 3_600_000
    with pytest.raises(InvalidArgumentError, match="beyond the gateway's maximum of 86400 s"):
        lifetimes.granted(lifetimes.Requested(ttl_seconds=999999), finite, now_ms=NOW)
    # "Never" takes both keys: a default of 0 under a maximum is refused at load.
    with pytest.raises(ValueError, match="default_ttl_seconds must be between 1 and max_ttl_seconds"):
        LifetimesConfig(default_ttl_seconds=0)
    never = LifetimesConfig(default_ttl_seconds=0, max_ttl_seconds=0)
    unlimited = lifetimes.Limits(default_ttl_seconds=never.default_ttl_seconds, max_ttl_seconds=never.max_ttl_seconds)
    assert lifetimes.granted(lifetimes.Requested(), unlimited, now_ms=NOW).expires_at_ms == 0
