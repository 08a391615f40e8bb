"""One fingerprint for equal shapes, different ones for different shapes."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.fingerprints import SandboxShape, canonical_json, fingerprint, shape_of
from warmshell.core.models import Resources, SandboxSpec

_env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
_envs = st.dictionaries(_env_names, st.text(max_size=8), max_size=6)


def test_quantity_spellings_match() -> None:
    a = shape_of("default", SandboxSpec(resources=Resources(cpu="0.2", memory="1Gi")), default_image="")
    b = shape_of("default", SandboxSpec(resources=Resources(cpu="200m", memory="1024Mi")), default_image="")
    assert (a.cpu_millis, a.memory_bytes) == (200, 2**30)
    assert fingerprint(a) == fingerprint(b)
    assert len(fingerprint(a)) == 64


def test_amounts_hash_as_their_normal_form() -> None:
    # The canonical JSON fingerprints have always hashed (pools made before shapes carried
    # amounts keep their fingerprints).
    shape = SandboxShape(workspace="default", image="", cpu_millis=200, memory_bytes=2**30)
    assert canonical_json(shape) == (
        '{"environment":{},"image":"","resources":{"cpu":"200m","memory":"1Gi"},'
        '"runtimeClassName":"","v":1,"workspace":"default"}'
    )
    assert '"resources":{"cpu":"","memory":""}' in canonical_json(SandboxShape(workspace="default", image=""))


@given(_envs)
def test_env_order_irrelevant(env: dict[str, str]) -> None:
    forward = SandboxShape(workspace="w", image="i", environment=dict(env))
    backward = SandboxShape(workspace="w", image="i", environment=dict(reversed(list(env.items()))))
    assert fingerprint(forward) == fingerprint(backward)


@given(_envs, _envs)
def test_different_env_different_fingerprint(a: dict[str, str], b: dict[str, str]) -> None:
    same = a == b
    assert (fingerprint(SandboxShape("w", "", a)) == fingerprint(SandboxShape("w", "", b))) == same


@given(st.sampled_from(["workspace", "image", "cpu_millis", "memory_bytes", "runtime_class_name"]))
def test_each_field_counts(field: str) -> None:
    base = SandboxShape(workspace="default", image="", cpu_millis=1000, memory_bytes=2**30, runtime_class_name="")
    changed = {
        "workspace": "other",
        "image": "/srv/rootfs",
        "cpu_millis": 2000,
        "memory_bytes": 2**31,
        "runtime_class_name": "gvisor",
    }[field]
    variant = SandboxShape(**{**base.__dict__, field: changed})
    assert fingerprint(base) != fingerprint(variant)


def test_a_process_count_changes_the_fingerprint_only_when_set() -> None:
    plain = SandboxShape(workspace="w", image="")
    assert "pids" not in canonical_json(plain)  # fingerprints made before pids existed still match
    assert fingerprint(replace(plain, pids=64)) != fingerprint(plain)
    assert fingerprint(replace(plain, pids=64)) == fingerprint(replace(plain, pids=64))
