"""The core model carries quantities as amounts: read from quantities once, rendered for display."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import Resources, SandboxSpec, Storage
from warmshell.core.quantities import normalize_cpu, normalize_memory


def test_quantities_become_amounts() -> None:
    resources = Resources(cpu="0.5", memory="1024Mi", pids=64)
    assert (resources.cpu_millis, resources.memory_bytes, resources.pids) == (500, 2**30, 64)
    assert (resources.cpu, resources.memory) == ("500m", "1Gi")
    storage = Storage(workspace="2048Mi", tmp="")
    assert (storage.workspace_bytes, storage.tmp_bytes) == (2**31, 0)
    assert (storage.workspace, storage.tmp) == ("2Gi", "")


def test_no_request_is_zero_and_renders_empty() -> None:
    assert Resources(cpu="", memory=" ") == Resources()
    assert (Resources().cpu, Resources().memory) == ("", "")


@given(st.integers(min_value=1, max_value=4096 * 1000), st.integers(min_value=1, max_value=2**46))
def test_the_rendered_form_is_the_normal_form(millis: int, size: int) -> None:
    resources = Resources(cpu_millis=millis, memory_bytes=size)
    assert normalize_cpu(resources.cpu) == resources.cpu
    assert normalize_memory(resources.memory) == resources.memory
    assert Resources(cpu=resources.cpu, memory=resources.memory) == resources


def test_a_record_stored_with_quantities_reads_back() -> None:
    # Specs stored before the model carried amounts spelled them as quantities.
    old = '{"image": "", "resources": {"cpu": "250m", "memory": "64Mi", "pids": 0}, "storage": {"workspace": "1Gi"}}'
    spec = SandboxSpec.model_validate_json(old)
    assert (spec.resources.cpu_millis, spec.resources.memory_bytes) == (250, 64 * 2**20)
    assert spec.storage.workspace_bytes == 2**30
    assert SandboxSpec.model_validate_json(spec.model_dump_json()) == spec


def test_a_bad_quantity_names_its_field() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        Resources(cpu="lots")
    assert caught.value.field == "cpu"
    with pytest.raises(InvalidArgumentError) as caught:
        Storage(tmp="1.5")
    assert caught.value.field == "tmp"
    with pytest.raises(InvalidArgumentError, match="must be a quantity string"):
        Resources.model_validate({"memory": 5})


def test_negative_amounts_are_refused() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Resources(cpu_millis=-1)


def test_records_are_stored_in_the_quantity_form_older_replicas_read() -> None:
    spec = SandboxSpec(resources=Resources(cpu="0.5", memory="1024Mi", pids=3), storage=Storage(workspace="2Gi"))
    stored = json.loads(spec.model_dump_json())
    assert stored["resources"] == {"cpu": "500m", "memory": "1Gi", "pids": 3}
    assert stored["storage"] == {"workspace": "2Gi", "tmp": ""}
    assert SandboxSpec.model_validate(stored) == spec


def test_no_command_is_stored_only_when_set_so_older_replicas_read_the_rest() -> None:
    assert "no_command" not in json.loads(SandboxSpec().model_dump_json())
    idle = SandboxSpec(no_command=True)
    stored = json.loads(idle.model_dump_json())
    assert stored["no_command"] is True
    assert SandboxSpec.model_validate(stored) == idle
