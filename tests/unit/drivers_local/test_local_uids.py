"""Sandbox uids: distinct while live, given back, and a full range refused."""

from __future__ import annotations

import re

import pytest

from warmshell.core.config import LocalDriverConfig, load_config
from warmshell.core.errors import InvalidArgumentError, UnavailableError
from warmshell.drivers.local.runtime.uids import UidRange


def test_uids_are_distinct_within_the_range_and_reusable() -> None:
    uids = UidRange(5000, 3)
    taken = {uids.acquire() for _ in range(3)}
    assert taken == {5000, 5001, 5002}
    with pytest.raises(UnavailableError, match="all 3 sandbox uids from 5000"):
        uids.acquire()
    uids.release(5001)
    assert uids.acquire() == 5001


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
