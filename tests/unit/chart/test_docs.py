"""Every chart value is documented: commented in values.yaml, listed in the README's table, and
known to values.schema.json (which is what makes a typo in a value an error)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from tests.unit.chart.rendering import CHART


def schema() -> dict[str, Any]:
    return dict(json.loads((CHART / "values.schema.json").read_text()))


def documented_values(node: dict[str, Any] | None = None, prefix: str = "") -> set[str]:
    """Dotted paths of the values users set: the schema's closed objects are sections (recursed
    into); anything else (scalars, lists, Kubernetes objects passed through) is one value."""
    node = node if node is not None else schema()
    paths: set[str] = set()
    for key, sub in node["properties"].items():
        if not prefix and key == "global":  # Helm's own, not ours
            continue
        if sub.get("type") == "object" and sub.get("additionalProperties") is False:
            paths |= documented_values(sub, f"{prefix}{key}.")
        else:
            paths.add(f"{prefix}{key}")
    return paths


def values_yaml_paths() -> dict[str, int]:
    """Dotted path → line number of every key in values.yaml."""
    found: dict[str, int] = {}
    stack: list[tuple[int, str]] = []
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines()):
        match = re.match(r"^( *)([A-Za-z0-9_]+):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        found[".".join(key for _, key in stack)] = number
    return found


def test_schema_and_values_yaml_describe_the_same_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in documented_values():
        node: Any = values
        for part in path.split("."):
            assert isinstance(node, dict), f"{path}: not a section in values.yaml"
            assert part in node, f"{path} is in values.schema.json but not in values.yaml"
            node = node[part]
    parts = [p.split(".") for p in documented_values()]
    sections = {".".join(p[:n]) for p in parts for n in range(1, len(p))}  # nested ones too
    extra = set(values_yaml_paths()) - documented_values() - sections
    extra = {p for p in extra if not any(p.startswith(f"{v}.") for v in documented_values())}
    assert not extra, f"values.yaml has values the schema does not know: {sorted(extra)}"


def test_every_value_has_a_comment_in_values_yaml() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    positions = values_yaml_paths()
    undocumented = [p for p in sorted(documented_values()) if not lines[positions[p] - 1].strip().startswith("#")]
    assert not undocumented, f"values without a comment right above them in values.yaml: {undocumented}"


def test_readme_table_lists_every_value_and_nothing_else() -> None:
    readme = (CHART / "README.md").read_text()
    assert "\n## Values\n" in readme
    table = readme.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Za-z0-9_.]+)` \| `[^|]*` \| [^|]+ \|$", table, flags=re.MULTILINE)
    assert len(rows) == len(set(rows)), "a value is listed twice"
    assert set(rows) == documented_values(), (
        f"missing from README: {sorted(documented_values() - set(rows))}; "
        f"stale in README: {sorted(set(rows) - documented_values())}"
    )


def test_readme_says_agent_sandbox_must_be_installed() -> None:
    readme = (CHART / "README.md").read_text()
    assert "manifest.yaml" in readme
    assert "extensions.yaml" in readme
