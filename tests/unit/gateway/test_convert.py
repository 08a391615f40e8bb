"""The gateway's edge turns a public create request into the core model once: the default
workspace resolved, quantities normalised, and errors naming the field in a fixed order
(workspace, name, labels, then the spec)."""

from __future__ import annotations

import pytest

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.errors import InvalidArgumentError
from warmshell.gateway import convert


def request(**overrides: object) -> pb.CreateSandboxRequest:
    fields: dict[str, object] = {
        "name": "one",
        "spec": pb.SandboxSpec(environment={"FOO": "bar"}, resources=pb.Resources(cpu="0.5", memory="1024Mi")),
        "labels": {"team": "a"},
    }
    return pb.CreateSandboxRequest(**(fields | overrides))  # type: ignore[arg-type]


def test_a_request_becomes_the_core_model_with_quantities_normalised() -> None:
    new = convert.new_sandbox(request())
    assert (new.workspace, new.name, dict(new.labels)) == ("default", "one", {"team": "a"})
    assert (new.spec.resources.cpu, new.spec.resources.memory) == ("500m", "1Gi")
    assert new.spec.environment == {"FOO": "bar"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"workspace": "Bad_WS", "name": "Bad_Name"}, "workspace"),
        ({"name": "Bad_Name", "labels": {"bad key!": "x"}}, "name"),
        ({"labels": {"bad key!": "x"}, "spec": pb.SandboxSpec(resources=pb.Resources(cpu="lots"))}, "labels"),
        ({"spec": pb.SandboxSpec(resources=pb.Resources(cpu="lots"))}, "spec.resources.cpu"),
    ],
)
def test_the_first_invalid_field_is_named(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        convert.new_sandbox(request(**overrides))
    assert caught.value.field.startswith(field)
