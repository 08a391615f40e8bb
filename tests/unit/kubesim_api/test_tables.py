"""Server-side printing helpers."""

from __future__ import annotations

import pytest

from kubesim.apiserver import tables


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (5, "5s"),
        (119, "119s"),
        (150, "2m30s"),
        (180, "3m"),
        (3600, "60m"),
        (4 * 3600 + 60, "4h1m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (30 * 86400, "30d"),
        (3 * 365 * 86400, "3y"),
    ],
)
def test_human_duration(seconds: float, expected: str) -> None:
    assert tables.human_duration(seconds) == expected


def test_json_path() -> None:
    obj = {
        "status": {"conditions": [{"type": "Other", "status": "x"}, {"type": "Ready", "status": "True"}]},
        "spec": {"items": [{"n": 1}]},
    }
    assert tables.json_path(obj, ".status.conditions[?(@.type=='Ready')].status") == "True"
    assert tables.json_path(obj, ".spec.items[0].n") == 1
    assert tables.json_path(obj, ".status.missing.deeper") is None


def test_wants_table() -> None:
    assert tables.wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert not tables.wants_table("application/json")
