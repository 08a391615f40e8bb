"""`helm lint --strict` and `helm template` pass for the defaults and every toggle combination, and
values the gateway cannot run with fail the render with a reason."""

from __future__ import annotations

import pytest

from tests.unit.chart.rendering import TOGGLES, lint, render, render_error


def toggles(warm: bool, profiles: bool) -> dict[str, object]:
    return {"warmPooling.enabled": warm, "warmPooling.profiles.enabled": profiles}


COMBINATIONS: list[dict[str, object]] = [{}, *[toggles(warm, profiles) for warm, profiles in TOGGLES]]
IDS = ["defaults", *(f"warm={warm}-profiles={profiles}" for warm, profiles in TOGGLES)]


@pytest.mark.parametrize("values", COMBINATIONS, ids=IDS)
def test_lint_strict(values: dict[str, object]) -> None:
    result = lint(values)
    assert result.returncode == 0, f"helm lint --strict failed:\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize("values", COMBINATIONS, ids=IDS)
def test_template_renders_well_formed_objects(values: dict[str, object]) -> None:
    manifests = render(values)
    assert manifests.objects
    for obj in manifests.objects:
        assert {"apiVersion", "kind", "metadata"} <= set(obj), obj
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "warmshell"
    names = [(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in manifests.objects]
    assert len(names) == len(set(names)), "two objects with the same kind, namespace and name"


def test_defaults_are_the_documented_ones() -> None:
    config = render().one("ConfigMap")["data"]["gateway.toml"]
    assert "[kubernetes.warm_pooling]\nenabled = true" in config
    assert "[kubernetes.warm_pooling.profiles]\nenabled = false" in config


def test_more_than_one_replica_is_refused_with_the_reason() -> None:
    error = render_error({"gateway.replicas": 2})
    assert "SQLite" in error
    assert "store.postgres.urlSecret" in error


def test_unknown_values_are_refused() -> None:
    # values.schema.json: a typo in a value must not be silently ignored.
    assert "typo" in render_error({"warmPooling.typo": True})


@pytest.mark.parametrize(
    "values",
    [
        {"gateway.sandboxTokenTtlSeconds": 10},
        {"warmPooling.profiles.maxReplicas": 0},
        {"gateway.logLevel": "LOUD"},
        {"gateway.stateDir": "relative/dir"},
    ],
)
def test_values_the_gateway_would_reject_are_refused_at_install(values: dict[str, object]) -> None:
    render_error(values)
