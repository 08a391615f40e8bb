"""Sandbox uids: distinct while live across the gateways sharing a sandbox_dir, given back, taken
back from a dead gateway once nothing runs as them, and a full range refused."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.config import LocalDriverConfig, load_config
from warmshell.core.errors import InvalidArgumentError, ResourceExhaustedError
from warmshell.drivers.local.runtime import uidlease
from warmshell.drivers.local.runtime.uidlease import UidLeases


def test_uids_are_distinct_within_the_range_and_reusable(tmp_path: Path) -> None:
    uids = UidLeases(tmp_path / "sandboxes", 5000, 3, gateway="gw-a")
    taken = {uids.acquire() for _ in range(3)}
    assert taken == {5000, 5001, 5002}
    with pytest.raises(ResourceExhaustedError, match=r"^local\.sandbox_uid_count: all 3 sandbox uids from 5000"):
        uids.acquire()
    uids.release(5001)
    assert uids.acquire() == 5001


def test_gateways_sharing_the_sandbox_dir_never_share_a_uid(tmp_path: Path) -> None:
    # Overlapping ranges of 2: {5000, 5001} and {5001, 5002}.
    a = UidLeases(tmp_path, 5000, 2, gateway="gw-a")
    b = UidLeases(tmp_path, 5001, 2, gateway="gw-b")
    assert {a.acquire(), a.acquire()} == {5000, 5001}
    assert b.acquire() == 5002
    with pytest.raises(ResourceExhaustedError):
        b.acquire()
    b.release(5001)  # not b's: left alone
    with pytest.raises(ResourceExhaustedError):
        b.acquire()
    a.release(5001)
    assert b.acquire() == 5001
    leases = {int(f.name): uidlease.Holder.parse(f.read_text()) for f in (tmp_path / uidlease.LEASES).iterdir()}
    assert {uid: h.gateway for uid, h in leases.items() if h} == {5000: "gw-a", 5001: "gw-b", 5002: "gw-b"}
    assert {h.pid for h in leases.values() if h} == {os.getpid()}  # and nothing else lies there


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another uid")
def test_a_dead_gateways_lease_is_taken_back_once_its_uid_runs_nothing(tmp_path: Path) -> None:
    dead = uidlease.Holder("gw-killed", os.getpid(), 1)  # this pid, another start time: another process
    (tmp_path / uidlease.LEASES).mkdir()
    for uid in (5000, 5001):
        (tmp_path / uidlease.LEASES / str(uid)).write_text(dead.render())
    mine = UidLeases(tmp_path, 5000, 2, gateway="gw-a")
    survivor = subprocess.Popen(["sleep", "60"], user=5001, group=5001)  # still runs as one of them
    try:
        assert mine.acquire() == 5000
        with pytest.raises(ResourceExhaustedError):
            mine.acquire()
    finally:
        survivor.kill()
        survivor.wait()
    assert mine.acquire() == 5001


@given(st.sets(st.integers(0, 40)), st.integers(0, 30), st.integers(1, 12))
def test_a_pick_is_in_the_range_and_unleased_or_none_when_all_are(held: set[int], base: int, count: int) -> None:
    picked = uidlease.pick(held, base, count)
    free = set(range(base, base + count)) - held
    assert picked in free if free else picked is None


@given(st.text(alphabet=st.characters(blacklist_categories=["Z", "C"]), min_size=1), st.integers(0), st.integers(0))
def test_a_holder_reads_back_as_written_and_a_cut_one_is_none(gateway: str, pid: int, started: int) -> None:
    holder = uidlease.Holder(gateway, pid, started)
    assert uidlease.Holder.parse(holder.render()) == holder
    assert uidlease.Holder.parse(holder.render()[: len(gateway)]) is None


def test_reclaimable_scans_processes_only_when_a_holder_is_gone() -> None:
    live, dead = uidlease.Holder("a", 1, 1), uidlease.Holder("b", 2, 2)

    def never() -> set[int]:
        raise AssertionError("scanned every process with no holder gone")

    assert uidlease.reclaimable({1: live}, alive=lambda h: True, in_use=never) == []
    table = {1: live, 2: dead, 3: dead, 4: None, 5: None}  # None: a lease file no one can read
    assert uidlease.reclaimable(table, alive=lambda h: h is live, in_use=lambda: {3, 5}) == [2, 4]


def test_defaults_are_unprivileged() -> None:
    config = LocalDriverConfig()
    assert config.sandbox_uid_base >= 1000
    assert config.sandbox_dir.is_absolute()


@pytest.mark.parametrize("key", ["local.extra_ro_binds", "local.sandbox_dir"])
def test_relative_paths_are_refused_naming_the_key(key: str) -> None:
    value: object = ["opt/tools"] if key.endswith("binds") else "sandboxes"
    with pytest.raises(InvalidArgumentError, match=re.escape(key)) as caught:
        load_config(None, {key: value})
    assert "absolute path" in str(caught.value)
