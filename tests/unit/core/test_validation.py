"""Every validation rule names its field and the rule it enforces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import validation
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.quantities import cpu_millis, memory_bytes
from warmshell.core.specs import build_spec


@pytest.mark.parametrize("name", ["Upper", "-lead", "trail-", "under_score", "a" * 41, "", "dot.ted"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        validation.validate_name(name)
    assert err.value.field == "name"


@pytest.mark.parametrize("workspace", ["Team", "a/b", "x" * 21, "sp ace"])
def test_invalid_workspaces(workspace: str) -> None:
    with pytest.raises(InvalidArgumentError, match="workspace"):
        validation.validate_workspace(workspace)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"1X": "v"}, "must match"),
        ({"A-B": "v"}, "must match"),
        ({"WARMSHELL_TOKEN": "v"}, "reserved"),
        ({"X": "a\x00b"}, "NUL"),
        ({f"K{i}": "v" for i in range(200)}, "at most"),
    ],
)
def test_invalid_environment(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment) as err:
        validation.validate_environment(env, field="spec.environment")
    assert err.value.field.startswith("spec.environment")


def test_oversized_environment_value() -> None:
    with pytest.raises(InvalidArgumentError, match="bytes in total"):
        validation.validate_environment({"BIG": "x" * (validation.MAX_ENV_BYTES + 1)})


@pytest.mark.parametrize(
    "labels", [{"warmshell.dev/x": "y"}, {"bad key": "v"}, {"k": "v" * 64}, {"Bad_Prefix./k": "v"}]
)
def test_invalid_labels(labels: dict[str, str]) -> None:
    with pytest.raises(InvalidArgumentError, match="labels"):
        validation.validate_labels(labels)


def test_valid_labels() -> None:
    validation.validate_labels({"team": "infra", "example.com/tier": "gold", "empty": ""})


def test_command_rules() -> None:
    with pytest.raises(InvalidArgumentError, match=r"command\[0\]"):
        validation.validate_command([""])
    with pytest.raises(InvalidArgumentError, match="NUL"):
        validation.validate_command(["echo", "a\x00"])
    with pytest.raises(InvalidArgumentError, match="arguments"):
        validation.validate_command(["x"] * (validation.MAX_COMMAND_ARGS + 1))


def test_build_spec_normalises_and_names_fields() -> None:
    spec = build_spec(image="", environment={"B": "2", "A": "1"}, cpu="0.2", memory="1024Mi", command=["true"])
    assert (spec.resources.cpu, spec.resources.memory) == ("200m", "1Gi")
    with pytest.raises(InvalidArgumentError) as err:
        build_spec(image="", environment={}, cpu="lots", memory="", command=[])
    assert err.value.field == "spec.resources.cpu"
    with pytest.raises(InvalidArgumentError) as err:
        build_spec(image="has space", environment={}, cpu="", memory="", command=[])
    assert err.value.field == "spec.image"


def test_no_command_is_refused_with_a_command_and_kept_without_one() -> None:
    assert build_spec(image="", environment={}, cpu="", memory="", command=[], no_command=True).no_command
    with pytest.raises(InvalidArgumentError) as err:
        build_spec(image="", environment={}, cpu="", memory="", command=["true"], no_command=True)
    assert err.value.field == "spec.no_command"


@given(st.integers(min_value=-(2**40), max_value=2**40))
def test_a_process_count_is_0_or_16_to_2_pow_22(pids: int) -> None:
    if pids == 0 or validation.MIN_PIDS <= pids <= validation.MAX_PIDS:
        validation.validate_resources(0, 0, pids)
    else:
        with pytest.raises(InvalidArgumentError) as caught:
            validation.validate_resources(0, 0, pids)
        assert caught.value.field == "spec.resources.pids"
        assert "between 16 and 4194304" in caught.value.rule


_SUFFIXES = st.sampled_from(["", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])


@given(st.integers(min_value=1, max_value=10**6), _SUFFIXES)
def test_memory_requests_are_4mi_to_64ti(number: int, suffix: str) -> None:
    text = f"{number}{suffix}"
    size = memory_bytes(text)
    if validation.MIN_MEMORY_BYTES <= size <= validation.MAX_MEMORY_BYTES:
        validation.validate_resources(0, size, typed=("", text))
    else:
        with pytest.raises(InvalidArgumentError) as caught:
            validation.validate_resources(0, size, typed=("", text))
        assert caught.value.field == "spec.resources.memory"
        assert ("less than 4Mi" if size < validation.MIN_MEMORY_BYTES else "more than 64Ti") in caught.value.rule


@given(st.integers(min_value=1, max_value=10**15), st.sampled_from(["", "m", "k", "M"]))
def test_cpu_requests_are_at_most_4096_cpus(number: int, suffix: str) -> None:
    text = f"{number}{suffix}"
    if cpu_millis(text) <= validation.MAX_CPU_MILLIS:
        validation.validate_resources(cpu_millis(text), 0, typed=(text, ""))
    else:
        with pytest.raises(InvalidArgumentError, match="more than 4096 cpus"):
            validation.validate_resources(cpu_millis(text), 0, typed=(text, ""))


@given(st.integers(min_value=1, max_value=10**6), _SUFFIXES)
def test_storage_sizes_are_1mi_to_64ti(number: int, suffix: str) -> None:
    text = f"{number}{suffix}"
    size = memory_bytes(text)
    if 2**20 <= size <= validation.MAX_MEMORY_BYTES:
        validation.validate_storage_size(text, field="storage.workspace")
    else:
        with pytest.raises(InvalidArgumentError) as caught:
            validation.validate_storage_size(text, field="storage.workspace")
        assert caught.value.field == "storage.workspace"
