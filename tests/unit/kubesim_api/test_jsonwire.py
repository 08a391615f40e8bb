"""kubesim's JSON (orjson): the same documents as the standard library's, numbers decoded as
Kubernetes decodes them, and nothing a write used to carry refused."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubesim import jsonwire

SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
DOCUMENTS = st.recursive(
    SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(DOCUMENTS)
def test_documents_round_trip_as_the_standard_library_reads_them(doc: Any) -> None:
    encoded = jsonwire.dumps(doc)
    assert json.loads(encoded) == doc
    assert jsonwire.loads(encoded) == doc
    assert jsonwire.loads(json.dumps(doc)) == doc


def test_integers_beyond_64_bits_decode_as_floats_as_in_kubernetes() -> None:
    assert jsonwire.loads(b'{"n": 9223372036854775807}') == {"n": 2**63 - 1}
    big = jsonwire.loads(b'{"n": 123456789012345678901234567890}')["n"]
    assert isinstance(big, float)


def test_what_orjson_refuses_to_encode_is_still_encoded() -> None:
    assert json.loads(jsonwire.dumps({"n": 2**70})) == {"n": 2**70}
    assert json.loads(jsonwire.dumps({1: "a"})) == {"1": "a"}


@pytest.mark.parametrize("raw", [b"NaN", b'{"a": Infinity}', b"{", b""])
def test_what_is_not_json_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):  # a ValueError, which the callers catch
        jsonwire.loads(raw)


@given(DOCUMENTS)
def test_a_copy_is_equal_and_shares_nothing(doc: Any) -> None:
    copied = jsonwire.copy_of({"doc": doc, "list": [doc]})
    assert copied == {"doc": doc, "list": [doc]}
    copied["list"].append(1)
    if isinstance(copied["doc"], dict | list):
        assert copied["doc"] is not doc


def test_a_copy_keeps_what_is_not_plain_json_as_it_was() -> None:
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    doc = {"at": when, "big": 2**70}
    copied = jsonwire.copy_of(doc)
    assert copied == doc
    assert isinstance(copied["at"], datetime.datetime)  # not turned into a string
