"""The one mapping from (workspace, name) to a namespaced object name."""

from __future__ import annotations

import pytest

from warmshell.core.errors import InvalidArgumentError
from warmshell.core.validation import MAX_NAME_LENGTH, MAX_WORKSPACE_LENGTH
from warmshell.drivers.kubernetes import naming

from .fakes import config


def test_shared_mode_puts_every_workspace_in_the_configured_namespace() -> None:
    ref = naming.object_ref(config(), "team-a", "build-1")
    assert (ref.namespace, ref.name) == ("warmshell", "team-a--build-1")
    assert str(ref) == "warmshell/team-a--build-1"


def test_the_longest_valid_workspace_and_name_fit_a_pod_name() -> None:
    ref = naming.object_ref(config(), "w" * MAX_WORKSPACE_LENGTH, "n" * MAX_NAME_LENGTH)
    assert len(ref.name) <= naming.MAX_OBJECT_NAME


def test_a_name_too_long_for_a_pod_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="longer than 63"):
        naming.object_ref(config(), "w" * 30, "n" * 32)


def test_only_the_configured_namespace_is_accepted() -> None:
    assert naming.namespace_accepted(config(), "warmshell")
    assert not naming.namespace_accepted(config(), "default")
    assert not naming.namespace_accepted(config(), "")
