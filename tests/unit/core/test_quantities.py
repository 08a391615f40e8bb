"""Quantity parsing and normal forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.errors import InvalidArgumentError
from warmshell.core.quantities import cpu_millis, memory_bytes, normalize_cpu, normalize_memory


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.2", "200m"), ("200m", "200m"), ("2000m", "2"), ("1", "1"), ("1.5", "1500m"), ("1e-1", "100m"), ("2e0", "2")],
)
def test_cpu_normal_form(text: str, expected: str) -> None:
    assert normalize_cpu(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1Gi", "1Gi"), ("1024Mi", "1Gi"), ("0.5Gi", "512Mi"), ("1G", "1000000000"), ("256Mi", "256Mi"), ("1024", "1Ki")],
)
def test_memory_normal_form(text: str, expected: str) -> None:
    assert normalize_memory(text) == expected


@pytest.mark.parametrize("bad", ["abc", "1.2.3", "-1", "0", "0.0001", "1Xi", "", "1 Gi"])
def test_invalid_cpu_names_the_field(bad: str) -> None:
    if bad == "":
        assert normalize_cpu(bad) == ""
        return
    with pytest.raises(InvalidArgumentError) as err:
        cpu_millis(bad, field="spec.resources.cpu")
    assert err.value.field == "spec.resources.cpu"


def test_fractional_bytes_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="whole number of bytes"):
        memory_bytes("1.5")


@given(st.integers(min_value=1, max_value=10**7))
def test_cpu_millis_round_trip(millis: int) -> None:
    assert cpu_millis(normalize_cpu(f"{millis}m")) == millis
    assert normalize_cpu(f"{millis / 1000}") == normalize_cpu(f"{millis}m")


@given(st.integers(min_value=1, max_value=2**50), st.sampled_from(["", "Ki", "Mi", "Gi"]))
def test_memory_equal_amounts_normalise_equal(amount: int, suffix: str) -> None:
    unit = {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}[suffix]
    assert normalize_memory(f"{amount}{suffix}") == normalize_memory(str(amount * unit))
    assert memory_bytes(normalize_memory(f"{amount}{suffix}")) == amount * unit


def test_the_exa_suffix_is_not_an_exponent() -> None:
    # "1E" once crashed the parser (ValueError, not a field error), found by hypothesis.
    assert memory_bytes("1E") == 10**18
    assert memory_bytes("2E3") == 2000
