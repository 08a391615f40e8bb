"""Run the real helm binary on deploy/helm/warmshell and hand the tests parsed manifests.

helm comes from `$HELM` or from where `scripts/install-helm` puts it (`.tools/bin/helm`, or
`$WARMSHELL_TOOLS_DIR/bin/helm`). A missing helm fails the tests: the chart checks are part of CI,
and a silent skip would let a broken chart through.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__ = [
    "CHART",
    "RELEASE",
    "RELEASE_NAMESPACE",
    "TOGGLES",
    "Manifests",
    "helm_binary",
    "lint",
    "render",
    "render_error",
    "set_args",
]

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "helm" / "warmshell"
RELEASE = "ws"
RELEASE_NAMESPACE = "warmshell-system"
HELM_TIMEOUT_SECONDS = 60

# (warmPooling.enabled, warmPooling.profiles.enabled): every combination of the two toggles.
TOGGLES: list[tuple[bool, bool]] = [(True, False), (True, True), (False, False), (False, True)]


def helm_binary() -> str:
    """The helm to run, or a test failure that says how to get one."""
    explicit = os.environ.get("HELM")
    if explicit:
        if not os.access(explicit, os.X_OK):
            pytest.fail(f"$HELM={explicit} is not an executable file")
        return explicit
    tools = Path(os.environ.get("WARMSHELL_TOOLS_DIR") or REPO / ".tools")
    candidate = tools / "bin" / "helm"
    if not os.access(candidate, os.X_OK):
        pytest.fail(
            f"helm not found at {candidate}: run scripts/install-helm (or set $HELM to a helm binary); "
            "the chart tests need a real helm",
        )
    return str(candidate)


def set_args(values: Mapping[str, object]) -> list[str]:
    """`--set-json key=value` for each entry: JSON keeps booleans, numbers and strings apart."""
    args: list[str] = []
    for key, value in sorted(values.items()):
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_binary(), *args],
        capture_output=True,
        text=True,
        timeout=HELM_TIMEOUT_SECONDS,
        check=False,
        cwd=REPO,
    )


def lint(values: Mapping[str, object]) -> subprocess.CompletedProcess[str]:
    """`helm lint --strict` with those values."""
    return _run(["lint", "--strict", str(CHART), "--namespace", RELEASE_NAMESPACE, *set_args(values)])


def _template(values: Mapping[str, object]) -> subprocess.CompletedProcess[str]:
    return _run(["template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, *set_args(values)])


def render_error(values: Mapping[str, object]) -> str:
    """stderr of a `helm template` that must fail (the test fails if it renders)."""
    result = _template(values)
    assert result.returncode != 0, f"helm template unexpectedly succeeded with {dict(values)}"
    return result.stderr


@dataclass(frozen=True)
class Manifests:
    """The objects one `helm template` rendered."""

    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """Every object of that kind."""
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        """The single object of that kind (and name); fails if there are none or several."""
        found = [obj for obj in self.of_kind(kind) if name is None or obj["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
        return found[0]


@functools.cache
def _render_cached(key: tuple[tuple[str, str], ...]) -> Manifests:
    values = {name: json.loads(encoded) for name, encoded in key}
    result = _template(values)
    assert result.returncode == 0, f"helm template failed with {values}:\n{result.stderr}"
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return Manifests(objects)


def render(values: Mapping[str, object] | None = None) -> Manifests:
    """`helm template` with those values, parsed (cached per distinct values: helm is a process)."""
    key = tuple(sorted((name, json.dumps(value)) for name, value in (values or {}).items()))
    return _render_cached(key)
