"""The Deployment controller's decisions: template hash, surge/unavailability, one rollout step, status."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubesim.apiserver import workloads
from kubesim.controllers import rollout


def _deployment(replicas: int, strategy: dict[str, Any] | None = None, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "generation": generation},
        "spec": {
            "replicas": replicas,
            "strategy": strategy or {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


def _rs(name: str, replicas: int, available: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 1},
        "spec": {"replicas": replicas},
        "status": {
            "replicas": replicas,
            "availableReplicas": available,
            "readyReplicas": available,
            "observedGeneration": 1,
        },
    }


def test_template_hash_ignores_its_own_label_and_tracks_changes() -> None:
    template = _deployment(1)["spec"]["template"]
    digest = rollout.template_hash(template)
    labelled = {**template, "metadata": {"labels": {"app": "web", rollout.POD_TEMPLATE_HASH: digest}}}
    assert rollout.template_hash(labelled) == digest
    changed = {**template, "spec": {"containers": [{"name": "c", "image": "j"}]}}
    assert rollout.template_hash(changed) != digest
    assert set(digest) <= set("bcdfghjklmnpqrstvwxz2456789")


@pytest.mark.parametrize(
    ("value", "total", "up", "expected"),
    [(2, 10, True, 2), ("25%", 4, True, 1), ("25%", 3, True, 1), ("25%", 3, False, 0), ("50%", 5, False, 2)],
)
def test_resolve_int_or_percent(value: Any, total: int, up: bool, expected: int) -> None:
    assert rollout.resolve(value, total, round_up=up) == expected


def test_both_zero_means_one_unavailable() -> None:
    d = _deployment(3, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}})
    assert rollout.surge_and_unavailable(d) == (0, 1)


def test_rolling_update_surges_then_waits_for_availability() -> None:
    d = _deployment(3)  # maxSurge 1, maxUnavailable 0
    new, old = _rs("web-new", 0), _rs("web-old", 3, available=3)
    step = rollout.plan(d, new, [old], old_pods=3)
    assert step.scale == {"web-new": 1}  # one extra pod, no old pod may go before it is available
    new = _rs("web-new", 1, available=0)
    assert rollout.plan(d, new, [old], old_pods=3).scale == {}
    new = _rs("web-new", 1, available=1)
    assert rollout.plan(d, new, [old], old_pods=3).scale == {"web-old": 2}


def test_recreate_scales_old_to_zero_and_waits_for_their_pods() -> None:
    d = _deployment(2, {"type": "Recreate"})
    new, old = _rs("web-new", 0), _rs("web-old", 2, available=2)
    assert rollout.plan(d, new, [old], old_pods=2).scale == {"web-old": 0}
    gone = _rs("web-old", 0)
    waiting = rollout.plan(d, new, [gone], old_pods=1)
    assert waiting.scale == {}
    assert waiting.waiting_for_old_pods
    assert rollout.plan(d, new, [gone], old_pods=0).scale == {"web-new": 2}


@given(
    desired=st.integers(0, 8),
    surge=st.integers(0, 3),
    unavailable=st.integers(0, 3),
    new_count=st.integers(0, 8),
    old_counts=st.lists(st.integers(0, 8), max_size=3),
    data=st.data(),
)
def test_a_step_never_breaks_the_surge_or_availability_bounds(
    desired: int, surge: int, unavailable: int, new_count: int, old_counts: list[int], data: st.DataObject
) -> None:
    d = _deployment(
        desired, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}
    )
    new = _rs("new", new_count, available=data.draw(st.integers(0, new_count)))
    old = [_rs(f"old{i}", n, available=data.draw(st.integers(0, n))) for i, n in enumerate(old_counts)]
    step = rollout.plan(d, new, old, old_pods=sum(old_counts))
    after = {
        rs["metadata"]["name"]: step.scale.get(rs["metadata"]["name"], rollout.replicas_of(rs)) for rs in [new, *old]
    }
    max_surge, max_unavailable = rollout.surge_and_unavailable(d)
    before_total = new_count + sum(old_counts)
    # Never grow beyond desired + surge (unless it was already beyond: then never grow at all).
    assert sum(after.values()) <= max(desired + max_surge, before_total)
    assert min(new_count, desired) <= after["new"] <= max(desired, new_count)
    # Old pods are removed only while what stays available covers desired - maxUnavailable.
    removed = sum(rollout.replicas_of(rs) - after[rs["metadata"]["name"]] for rs in old)
    if removed:
        new_unavailable = max(after["new"] - rollout.available_of(new), 0)
        assert sum(after.values()) - new_unavailable >= desired - max_unavailable


def test_status_reports_progress_until_the_new_replica_set_is_available() -> None:
    d = _deployment(2, generation=3)
    new, old = _rs("web-new", 2, available=1), _rs("web-old", 1, available=1)
    status = rollout.status(d, new, [new, old], now="2026-01-01T00:00:00Z")
    assert status["observedGeneration"] == 3
    assert (status["replicas"], status["updatedReplicas"], status["availableReplicas"]) == (3, 2, 2)
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "ReplicaSetUpdated"
    done = rollout.status(
        d, _rs("web-new", 2, available=2), [_rs("web-new", 2, available=2)], now="2026-01-01T00:00:01Z"
    )
    progressing = next(c for c in done["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "NewReplicaSetAvailable"
    assert "unavailableReplicas" not in done


def test_deployment_defaults_and_selector_rules() -> None:
    d = _deployment(1)
    d["spec"].pop("strategy")
    workloads.default("deployments", d)
    assert d["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
    }
    assert (d["spec"]["revisionHistoryLimit"], d["spec"]["progressDeadlineSeconds"]) == (10, 600)
    assert [e["field"] for e in workloads.validate("deployments", d, None)] == ["spec.selector"]
    d["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    (err,) = workloads.validate("deployments", d, None)
    assert err["field"] == "spec.template.metadata.labels"
    assert "`selector` does not match template `labels`" in err["message"]
    d["spec"]["selector"] = {"matchLabels": {"app": "web"}}
    assert workloads.validate("deployments", d, None) == []
    changed = {**d, "spec": {**d["spec"], "selector": {"matchLabels": {"app": "web", "x": "y"}}}}
    changed["spec"]["template"] = {**d["spec"]["template"], "metadata": {"labels": {"app": "web", "x": "y"}}}
    (err,) = workloads.validate("deployments", changed, d)
    assert err["field"] == "spec.selector"
    assert "field is immutable" in err["message"]
