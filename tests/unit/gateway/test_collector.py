"""The gateway's use of the collector: start-up objects frozen, the young threshold as configured,
no full pass started by the interpreter, full passes at quiet moments (or when overdue), and
every pause timed into warmshell_gc_pause_seconds."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from warmshell.core.config import load_config
from warmshell.gateway import collector, metrics
from warmshell.gateway.collector import FullCollections, full_pass_due


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds, callbacks = gc.get_threshold(), list(gc.callbacks)
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    gc.callbacks[:] = callbacks


def pauses(generation: str) -> float:
    value = metrics.REGISTRY.get_sample_value("warmshell_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


@pytest.mark.usefixtures("restored_gc")
def test_install_freezes_start_up_sets_the_young_threshold_and_times_collections() -> None:
    config = load_config(None)
    assert config.gc_young_threshold == 700  # the interpreter's, measured best
    assert (config.gc_full_interval_seconds, config.gc_full_overdue_seconds) == (30.0, 120.0)
    collector.install(12_345)
    assert gc.get_threshold()[0] == 12_345
    assert gc.get_freeze_count() > 0
    before = pauses("2")
    collector.install(12_345)  # a second call (tests start many gateways) times each collection once
    gc.collect()
    assert pauses("2") - before == 2  # install's own collect, then ours


@pytest.mark.usefixtures("restored_gc")
def test_the_interpreter_starts_no_full_pass_of_its_own_after_install() -> None:
    collector.install(700)
    full, young = pauses("2"), pauses("1")
    # 300k long-lived containers: by its own rule the interpreter would run several full passes.
    kept = [{"n": i} for i in range(300_000)]
    assert pauses("1") > young  # young collections still run
    assert pauses("2") == full
    del kept


@pytest.mark.parametrize(
    ("since_last", "busy", "due"),
    [
        (10.0, False, False),  # too soon
        (30.0, False, True),  # due, and quiet
        (30.0, True, False),  # due, but a create is in flight: wait
        (119.9, True, False),
        (120.0, True, True),  # overdue: run whatever is in flight
    ],
)
def test_a_full_pass_waits_for_a_quiet_moment_until_overdue(since_last: float, busy: bool, due: bool) -> None:
    assert full_pass_due(since_last, busy, interval=30.0, overdue=120.0) is due


@pytest.mark.usefixtures("restored_gc")
def test_full_collections_run_when_due_and_reclaim_cycles() -> None:
    collector.install(700)

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.collect(1)  # the cycle survives a young collection into the oldest generation
    del a, b
    gc.collect(1)
    assert gone() is not None  # young collections do not reach it
    busy = [True]
    full = FullCollections(lambda: busy[0], interval=0.0, overdue=3600.0)
    before = pauses("2")
    assert not full.maybe_collect()  # a create in flight
    busy[0] = False
    assert full.maybe_collect()
    assert pauses("2") == before + 1
    assert gone() is None
