"""The gateway's collector tuning: start-up objects frozen, the young threshold as configured,
and every collection timed into warmshell_gc_pause_seconds."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from warmshell.core.config import load_config
from warmshell.gateway import metrics
from warmshell.gateway.server import tune_gc


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
def test_tuning_freezes_start_up_sets_the_threshold_and_times_collections() -> None:
    assert load_config(None).gc_young_threshold == 700  # the interpreter's, measured best
    tune_gc(12_345)
    assert gc.get_threshold()[0] == 12_345
    assert gc.get_freeze_count() > 0
    before = pauses("2")
    tune_gc(12_345)  # a second call (tests start many gateways) times each collection once
    gc.collect()
    assert pauses("2") - before == 2  # tune_gc's own collect, then ours
