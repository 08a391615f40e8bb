"""Bootstrap credentials: format, entropy, parsing and constant-time checks."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.ids import InstanceId
from warmshell.drivers.local import credentials


def test_format_and_entropy() -> None:
    instance = credentials.new_instance_id()
    assert "." not in instance
    credential = credentials.new_credential(instance)
    prefix, found, secret = credential.split(".")
    assert prefix == "wsl1"
    assert found == instance
    assert len(base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))) >= 32
    assert credentials.new_credential(instance) != credential


def test_digest_and_matches() -> None:
    credential = credentials.new_credential(InstanceId("li-1"))
    kept = credentials.digest(credential)
    assert credential not in kept
    assert credentials.matches(credential, kept)
    assert not credentials.matches(credential + "x", kept)


@given(st.text())
def test_instance_of_never_raises(text: str) -> None:
    found = credentials.instance_of(text)
    if found is not None:
        assert text.startswith("wsl1.")
        assert text == f"wsl1.{found}.{text.split('.', 2)[2]}"


def test_instance_of() -> None:
    assert credentials.instance_of("wsl1.li-1.secret") == "li-1"
    assert credentials.instance_of("wsl1.li-1") is None
    assert credentials.instance_of("wsl1..secret") is None
    assert credentials.instance_of("wsl1.li-1.") is None
    assert credentials.instance_of("Bearer x") is None
