"""Fixtures: a real in-process gateway with the local driver and bwrap'd supervisors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state") as running:
        yield running
