"""The Kubernetes driver's replica leadership: one task on the Lease whether it was started for
the singletons alone or not, leading once the Lease is won, released on close."""

from __future__ import annotations

from warmshell.drivers.kubernetes.profiles.leadership import Leadership

from .clocks import settle
from .fakes import config
from .test_lease import LeaseStore


async def test_a_campaign_wins_a_free_lease_once_and_close_releases_it() -> None:
    store = LeaseStore()
    leadership = Leadership(store, config())  # type: ignore[arg-type]
    assert not leadership.leading(), "no campaign, no leadership"
    leadership.campaign()
    leadership.campaign()  # the task is already running: nothing more campaigns
    await settle()
    assert leadership.leading()
    assert store.writes == [config().leader_election.identity], "one create, by one campaign"
    await leadership.aclose()
    assert not leadership.leading()
    assert store.holder == "", "released on close, so another replica takes over at once"
