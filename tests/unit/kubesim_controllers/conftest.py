"""Fixtures for the pure controller tests."""

from __future__ import annotations

from typing import Any

import pytest
from ksc_builders import make_pool, make_template

Obj = dict[str, Any]


@pytest.fixture
def template() -> Obj:
    return make_template()


@pytest.fixture
def pool() -> Obj:
    return make_pool()
