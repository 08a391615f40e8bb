"""One fingerprint for equal shapes, different ones for different shapes."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.fingerprints import SandboxShape, canonical_json, fingerprint

_env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
_envs = st.dictionaries(_env_names, st.text(max_size=8), max_size=6)


def test_quantity_spellings_match() -> None:
    a = SandboxShape(workspace="default", image="", cpu="0.2", memory="1Gi")
    b = SandboxShape(workspace="default", image="", cpu="200m", memory="1024Mi")
    assert fingerprint(a) == fingerprint(b)
    assert len(fingerprint(a)) == 64


@given(_envs)
def test_env_order_irrelevant(env: dict[str, str]) -> None:
    forward = SandboxShape(workspace="w", image="i", environment=dict(env))
    backward = SandboxShape(workspace="w", image="i", environment=dict(reversed(list(env.items()))))
    assert fingerprint(forward) == fingerprint(backward)


@given(_envs, _envs)
def test_different_env_different_fingerprint(a: dict[str, str], b: dict[str, str]) -> None:
    same = a == b
    assert (fingerprint(SandboxShape("w", "", a)) == fingerprint(SandboxShape("w", "", b))) == same


@given(st.sampled_from(["workspace", "image", "cpu", "memory", "runtime_class_name"]))
def test_each_field_counts(field: str) -> None:
    base = SandboxShape(workspace="default", image="", cpu="1", memory="1Gi", runtime_class_name="")
    changed = {
        "workspace": "other",
        "image": "/srv/rootfs",
        "cpu": "2",
        "memory": "2Gi",
        "runtime_class_name": "gvisor",
    }[field]
    variant = SandboxShape(**{**base.__dict__, field: changed})
    assert fingerprint(base) != fingerprint(variant)


def test_a_process_count_changes_the_fingerprint_only_when_set() -> None:
    plain = SandboxShape(workspace="w", image="")
    assert "pids" not in canonical_json(plain)  # fingerprints made before pids existed still match
    assert fingerprint(replace(plain, pids=64)) != fingerprint(plain)
    assert fingerprint(replace(plain, pids=64)) == fingerprint(replace(plain, pids=64))
