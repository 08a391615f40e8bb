"""Image references: NAME[:TAG], NAME@DIGEST, a digest alone; each refusal names the field."""

from __future__ import annotations

import pytest

from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.local.imagestore.references import Reference, parse_reference, parse_tagged_name

HEX = "a" * 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("python", Reference(name="python", tag="latest")),
        ("python:3.12", Reference(name="python", tag="3.12")),
        ("localhost:5000/team/tool", Reference(name="localhost:5000/team/tool", tag="latest")),
        ("localhost:5000/team/tool:v1", Reference(name="localhost:5000/team/tool", tag="v1")),
        (f"python@sha256:{HEX}", Reference(name="python", digest=f"sha256:{HEX}")),
        (f"python:1@sha256:{HEX}", Reference(name="python", tag="1", digest=f"sha256:{HEX}")),
        (f"sha256:{HEX}", Reference(digest=f"sha256:{HEX}")),
        (HEX, Reference(digest=f"sha256:{HEX}")),
    ],
)
def test_references_parse(text: str, expected: Reference) -> None:
    assert parse_reference(text, field="spec.image") == expected
    assert parse_reference(str(expected), field="spec.image") == expected  # the pinned form reads back


@pytest.mark.parametrize(
    "text",
    ["", "Python", "python:", "python:-x", "python@sha256:short", "a//b", "python:1@sha256:XYZ", "sha256:XYZ"],
)
def test_bad_references_name_the_field(text: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_reference(text, field="spec.image")
    assert caught.value.field == "spec.image"


def test_a_tagged_name_defaults_to_latest_and_refuses_digests() -> None:
    assert parse_tagged_name("tool", field="name").tagged == "tool:latest"
    with pytest.raises(InvalidArgumentError, match="name"):
        parse_tagged_name(f"sha256:{HEX}", field="name")
