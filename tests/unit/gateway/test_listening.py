"""How many connections each gateway server accepts: as configured, within the listeners'
descriptor budget, which leaves the core (store, sandboxes) at least half the descriptors."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.gateway import listening


def test_the_configured_limit_when_descriptors_allow_it() -> None:
    assert listening.connection_limit(4096, 20000) == 4096


def test_a_low_fd_limit_lowers_it() -> None:
    # Half of 8192 is the core's; the rest, less HTTP's share, split between the two servers.
    assert listening.connection_limit(4096, 8192) == (4096 - listening.HTTP_MAX_CONNECTIONS) // 2


def test_the_core_keeps_its_headroom_under_a_small_limit() -> None:
    assert listening.listener_budget(1024) == 0
    assert listening.listener_budget(1500) == 1500 - listening.FD_HEADROOM
    assert listening.connection_limit(4096, 1024) == listening.MIN_CONNECTIONS


@given(st.integers(min_value=16, max_value=1 << 20), st.integers(min_value=1024, max_value=1 << 20))
def test_the_listeners_together_never_take_the_cores_descriptors(configured: int, fd_limit: int) -> None:
    limit = listening.connection_limit(configured, fd_limit)
    assert listening.MIN_CONNECTIONS <= limit <= configured
    held = limit * listening.SERVERS + listening.HTTP_MAX_CONNECTIONS
    core = max(listening.FD_HEADROOM, fd_limit // 2)
    assert limit == listening.MIN_CONNECTIONS or held + core <= fd_limit
