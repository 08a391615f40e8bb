"""Fixtures for the red team's attacks: a real in-process gateway (real gRPC on real sockets, the
real local driver, bwrap'd sandboxes with their host-side supervisors) and a sandbox in it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state", listen_tcp="127.0.0.1:0") as running:
        yield running
