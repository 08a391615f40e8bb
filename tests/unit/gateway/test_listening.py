"""How many connections each gateway server accepts: as configured, within the fd limit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.gateway import listening


def test_the_configured_limit_when_descriptors_allow_it() -> None:
    assert listening.connection_limit(4096, 20000) == 4096


def test_a_low_fd_limit_lowers_it() -> None:
    # Two servers, 1024 descriptors kept for the store, the driver and HTTP.
    assert listening.connection_limit(4096, 4096) == (4096 - listening.FD_HEADROOM) // 2


@given(st.integers(min_value=16, max_value=1 << 20), st.integers(min_value=1024, max_value=1 << 20))
def test_the_servers_together_never_take_every_descriptor(configured: int, fd_limit: int) -> None:
    limit = listening.connection_limit(configured, fd_limit)
    assert listening.MIN_CONNECTIONS <= limit <= configured
    assert limit == listening.MIN_CONNECTIONS or limit * listening.SERVERS + listening.FD_HEADROOM <= fd_limit
