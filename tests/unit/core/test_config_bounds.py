"""`[local]` defaults are held to their maximums when the config is loaded, not at the first create."""

from __future__ import annotations

from typing import Any

import pytest

from warmshell.core.config import LocalDriverConfig, load_config
from warmshell.core.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("settings", "rule"),
    [
        ({"default_cpu": "4", "max_cpu": "2"}, "default_cpu (4) is more than max_cpu (2)"),
        ({"default_cpu": "2001m", "max_cpu": "2"}, "default_cpu (2001m) is more than max_cpu (2)"),
        ({"default_memory": "4Gi", "max_memory": "1Gi"}, "default_memory (4Gi) is more than max_memory (1Gi)"),
        ({"max_storage_size": "512Mi"}, "workspace_size (1Gi) is more than max_storage_size (512Mi)"),
        (
            {"workspace_size": "", "tmp_size": "1Gi", "max_storage_size": "512Mi"},
            "tmp_size (1Gi) is more than max_storage_size (512Mi)",
        ),
        ({"max_pids": 100}, "max_processes (1024) is more than max_pids (100)"),
        ({"default_cpu": "lots", "max_cpu": "2"}, "default_cpu: 'lots' is not a Kubernetes quantity"),
        ({"max_memory": "0"}, "max_memory: '0' must be greater than zero"),
    ],
)
def test_a_default_above_its_maximum_is_refused_naming_both_keys(settings: dict[str, Any], rule: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        load_config(None, {f"local.{key}": value for key, value in settings.items()})
    assert caught.value.field == "config: local"
    assert caught.value.rule.startswith(rule)


def test_defaults_within_their_maximums_load() -> None:
    config = LocalDriverConfig(
        default_cpu="2",
        max_cpu="2000m",
        default_memory="1Gi",
        max_memory="1024Mi",
        workspace_size="1Gi",
        tmp_size="256Mi",
        max_storage_size="1Gi",
        max_processes=64,
        max_pids=64,
    )
    assert (config.default_cpu, config.max_processes) == ("2", 64)
    # No default (""), or no maximum ("": the host's size, which the driver checks), is no conflict.
    assert LocalDriverConfig(default_cpu="", max_cpu="1").default_cpu == ""
    assert LocalDriverConfig(default_cpu="64").max_cpu == ""
    assert LocalDriverConfig(workspace_size="", max_storage_size="128Mi", tmp_size="128Mi").workspace_size == ""
