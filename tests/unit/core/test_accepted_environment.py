"""Accepted environment: a pool's patterns leave matching keys out of a request's match; other keys
still match by value; several matches are Ambiguous; the pattern set is part of the pool's shape."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.fingerprints import SandboxShape, accepting, fingerprint
from warmshell.core.matching import Ambiguous, Match, NoMatch, PoolIndex
from warmshell.core.profiles import ProfileError, parse_profile

KEYS = st.sampled_from(["FOO", "TASK_ID", "TASK_RUN", "RUN_1", "RUN_22", "OTHER", "T"])
VALUES = st.sampled_from(["", "bar", "baz", "9"])
ENVS = st.dictionaries(KEYS, VALUES, max_size=5)
PATTERNS = st.lists(st.sampled_from(["TASK_*", "RUN_?", "OTHER", "T*", "*_ID"]), max_size=3, unique=True)


def pool_shape(baked: dict[str, str], patterns: list[str]) -> SandboxShape:
    return SandboxShape("default", "img", baked, accepted=tuple(sorted(patterns)))


def index(*pools: tuple[str, SandboxShape]) -> PoolIndex[str]:
    accepted = {name: shape.accepted for name, shape in pools}
    return PoolIndex(((fingerprint(s), n) for n, s in pools), accepts=lambda name: accepted[name])


@given(baked=ENVS, patterns=PATTERNS, extra=ENVS)
def test_a_request_matches_iff_its_unaccepted_keys_equal_the_baked_ones(
    baked: dict[str, str], patterns: list[str], extra: dict[str, str]
) -> None:
    baked = {k: v for k, v in baked.items() if not any(fnmatchcase(k, p) for p in patterns)}  # the profile rule
    request = {**extra, **baked} if extra else dict(baked)
    result = index(("p", pool_shape(baked, patterns))).match(SandboxShape("default", "img", request))
    kept = {k: v for k, v in request.items() if not any(fnmatchcase(k, p) for p in patterns)}
    if kept == baked:
        assert result == Match("p", tuple(sorted(set(request) - set(kept))))
    else:
        assert result == NoMatch()


@given(env=ENVS, first=PATTERNS, second=PATTERNS)
def test_pools_of_one_baked_shape_match_unambiguously_or_are_ambiguous(
    env: dict[str, str], first: list[str], second: list[str]
) -> None:
    pools = index(("a", pool_shape({}, first)), ("b", pool_shape({}, second)))
    result = pools.match(SandboxShape("default", "img", env))
    matching = [
        name
        for name, patterns in (("a", first), ("b", second))
        if all(any(fnmatchcase(k, p) for p in patterns) for k in env)
    ]
    if sorted(first) == sorted(second) and matching:
        assert isinstance(result, Ambiguous)  # the same pool twice: operators must fix it
    elif len(matching) == 2:
        assert result == Ambiguous(("a", "b")) or result == Ambiguous(("b", "a"))
    elif len(matching) == 1:
        assert isinstance(result, Match)
        assert result.pool == matching[0]
    else:
        assert result == NoMatch()


def test_the_pattern_set_is_part_of_the_fingerprint_and_order_does_not_matter() -> None:
    plain = fingerprint(pool_shape({"FOO": "bar"}, []))
    assert plain == fingerprint(SandboxShape("default", "img", {"FOO": "bar"}))  # unchanged for old pools
    assert fingerprint(pool_shape({"FOO": "bar"}, ["TASK_*"])) != plain
    assert fingerprint(pool_shape({}, ["A", "B"])) == fingerprint(pool_shape({}, ["B", "A"]))


def test_accepting_reports_the_injected_keys() -> None:
    shape, injected = accepting(SandboxShape("default", "img", {"FOO": "bar", "TASK_ID": "9"}), ("TASK_*",))
    assert injected == ("TASK_ID",)
    assert dict(shape.environment) == {"FOO": "bar"}


PROFILE = 'version = 1\nworkspace = "default"\nreplicas = 1\n'


def test_profile_activation_patterns_are_parsed_and_part_of_its_identity() -> None:
    one = parse_profile(
        PROFILE + '[activation]\nenvironment = ["RUN_*", "TASK_ID"]\n', name="p", source="p.toml", max_replicas=4
    )
    same = parse_profile(
        PROFILE + '[activation]\nenvironment = ["TASK_ID", "RUN_*"]\n', name="p", source="p.toml", max_replicas=4
    )
    other = parse_profile(PROFILE, name="p", source="p.toml", max_replicas=4)
    assert one.accepted_environment == ("RUN_*", "TASK_ID")
    assert one.same_pool(same)
    assert not one.same_pool(other)
    assert one.fingerprint("img") != other.fingerprint("img")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[activation]\nenvironment = ["1X"]\n', "p.toml:5: activation.environment[0]: '1X' must be a variable name"),
        ('[activation]\nenvironment = "TASK_*"\n', "activation.environment: must be a list of strings"),
        ("[activation]\nenv = []\n", "activation.env: unknown key; allowed: environment"),
        ('[activation]\nenvironment = ["WARMSHELL_*"]\n', "reserved"),
        (
            '[environment]\nTASK_A = "x"\n[activation]\nenvironment = ["TASK_*"]\n',
            "p.toml:5: environment.TASK_A: is also accepted by [activation] environment",
        ),
    ],
)
def test_bad_activation_tables_name_the_key_and_rule(body: str, message: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profile(PROFILE + body, name="p", source="p.toml", max_replicas=4)
    assert message in str(caught.value)
