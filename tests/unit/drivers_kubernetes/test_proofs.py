"""Sealed activation proofs: readable back only for the same object, only with the key."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from warmshell.core.errors import FailedPreconditionError
from warmshell.drivers.kubernetes.proofs import ProofSealer, load_or_create_key

WHERE = {"namespace": "warmshell", "name": "default--one", "sandbox_id": "sbx-1"}


def test_round_trip_and_fresh_nonces() -> None:
    sealer = ProofSealer(bytes(32))
    first, second = sealer.seal("p", **WHERE), sealer.seal("p", **WHERE)
    assert first != second
    assert sealer.open(first, **WHERE) == sealer.open(second, **WHERE) == "p"


@pytest.mark.parametrize("field", ["namespace", "name", "sandbox_id"])
def test_a_proof_sealed_for_another_object_does_not_open(field: str) -> None:
    sealer = ProofSealer(bytes(32))
    sealed = sealer.seal("p", **WHERE)
    assert sealer.open(sealed, **(WHERE | {field: "other"})) is None


@pytest.mark.parametrize("value", ["", "p", "v1.", "v1.!!!", "v2.AAAA", "v1." + "A" * 60])
def test_garbage_does_not_open(value: str) -> None:
    assert ProofSealer(bytes(32)).open(value, **WHERE) is None


def test_another_key_does_not_open() -> None:
    sealed = ProofSealer(bytes(32)).seal("p", **WHERE)
    assert ProofSealer(b"\1" * 32).open(sealed, **WHERE) is None


def test_the_key_file_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "state" / "kubernetes-proof.key"
    key = load_or_create_key(path)
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(path) == key


def test_a_raw_or_base64_key_is_accepted_and_a_bad_one_refused(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.write_bytes(b"k" * 32)
    assert load_or_create_key(raw) == b"k" * 32
    encoded = tmp_path / "b64"
    encoded.write_text(base64.b64encode(b"x" * 32).decode() + "\n")
    assert load_or_create_key(encoded) == b"x" * 32
    bad = tmp_path / "bad"
    bad.write_text("short")
    with pytest.raises(FailedPreconditionError):
        load_or_create_key(bad)
