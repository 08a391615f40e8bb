import datetime
from typing import Any

import pytest
from ksc_builders import make_claim, make_pool, make_template

from kubesim.controllers import candidates, claims, pools
from kubesim.controllers.hashing import name_hash

Obj = dict[str, Any]
AT = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def warm(name: str = "pool-abcde", *, ready: bool = True) -> Obj:
    sb = pools.build_warm_sandbox(make_pool(), make_template())
    sb["metadata"].update({"name": name, "uid": "sb-uid", "resourceVersion": "42"})
    sb["status"] = {
        "podIPs": ["127.1.0.2"],
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "DependenciesReady" if ready else "DependenciesNotReady",
                "message": "Pod is Ready",
                "lastTransitionTime": "2025-12-31T23:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }
    return sb


def test_adoptable_and_candidate_checks() -> None:
    sb = warm()
    assert candidates.is_adoptable(sb)
    assert candidates.candidate_for(make_claim(), sb)
    assert not candidates.candidate_for(make_claim(pool="other"), sb)
    deleting = warm()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not candidates.is_adoptable(deleting)
    unlabelled = warm()
    del unlabelled["metadata"]["labels"]["agents.x-k8s.io/warm-pool-sandbox"]
    assert not candidates.is_adoptable(unlabelled)


def test_adoption_patch_swaps_owner_and_rewrites_labels_under_optimistic_lock() -> None:
    claim = make_claim(additionalPodMetadata={"labels": {"sandbox.users.io/x": "1"}})
    patch = claims.adoption_patch(claim, warm(), make_template())
    meta = patch["metadata"]
    assert meta["resourceVersion"] == "42"
    assert meta["labels"] == {
        "agents.x-k8s.io/warm-pool-sandbox": None,
        "agents.x-k8s.io/sandbox-template-hash": None,
        "agents.x-k8s.io/sandbox-pod-template-hash": None,
        "agents.x-k8s.io/launch-type": "warm",
        "agents.x-k8s.io/claim-uid": "claim-uid",
        "agents.x-k8s.io/sandbox-template-ref-hash": name_hash("tmpl"),
        "agents.x-k8s.io/created-by": "python-client",
    }
    assert meta["annotations"] == {"agents.x-k8s.io/pod-name": "pool-abcde"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "name": "claim",
            "uid": "claim-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    pt = patch["spec"]["podTemplate"]["metadata"]
    assert pt["labels"]["agents.x-k8s.io/sandbox-template-hash"] is None
    assert pt["labels"]["agents.x-k8s.io/warm-pool-sandbox"] is None
    assert pt["labels"]["agents.x-k8s.io/claim-uid"] == "claim-uid"
    assert pt["labels"]["sandbox.users.io/x"] == "1"
    assert pt["labels"]["app"] == "agent"
    assert pt["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] is None


def test_cold_sandbox_is_named_like_the_claim() -> None:
    sb = claims.cold_sandbox(make_claim(), make_template())
    meta = sb["metadata"]
    assert meta["name"] == "claim"
    assert "generateName" not in meta
    assert meta["labels"] == {
        "agents.x-k8s.io/claim-uid": "claim-uid",
        "agents.x-k8s.io/launch-type": "cold",
        "agents.x-k8s.io/sandbox-template-ref-hash": name_hash("tmpl"),
        "agents.x-k8s.io/created-by": "python-client",
    }
    assert meta["annotations"] == {"agents.x-k8s.io/sandbox-template-ref": "tmpl"}
    assert meta["ownerReferences"][0]["kind"] == "SandboxClaim"
    assert sb["spec"]["podTemplate"]["metadata"]["labels"]["agents.x-k8s.io/claim-uid"] == "claim-uid"
    assert sb["spec"]["podTemplate"]["spec"]["automountServiceAccountToken"] is False


def test_env_forces_cold_and_follows_the_template_policy() -> None:
    claim = make_claim(env=[{"name": "FOO", "value": "bar"}])
    assert claims.forces_cold(claim)
    with pytest.raises(claims.ClaimError) as err:
        claims.cold_sandbox(claim, make_template())
    assert err.value.reason == "EnvVarsInjectionRejected"
    sb = claims.cold_sandbox(claim, make_template(envVarsInjectionPolicy="Allowed"))
    env = sb["spec"]["podTemplate"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "FOO", "value": "bar"}]
    tmpl = make_template(envVarsInjectionPolicy="Allowed")
    tmpl["spec"]["podTemplate"]["spec"]["containers"][0]["env"] = [{"name": "FOO", "value": "x"}]
    with pytest.raises(claims.ClaimError):
        claims.cold_sandbox(claim, tmpl)
    tmpl["spec"]["envVarsInjectionPolicy"] = "Overrides"
    env = claims.cold_sandbox(claim, tmpl)["spec"]["podTemplate"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "FOO", "value": "bar"}]


@pytest.mark.parametrize(
    ("labels", "annotations"),
    [
        ({"nodomain": "x"}, {}),
        ({"evil.example.com/x": "y"}, {}),
        ({"sandbox.users.io/x": "bad value!"}, {}),
        ({}, {"kubernetes.io/x": "y"}),
        ({}, {"agents.x-k8s.io/x": "y"}),
    ],
)
def test_invalid_additional_metadata(labels: dict[str, str], annotations: dict[str, str]) -> None:
    claim = make_claim(additionalPodMetadata={"labels": labels, "annotations": annotations})
    with pytest.raises(claims.ClaimError) as err:
        claims.validate_additional_metadata(claim)
    assert err.value.reason == "InvalidMetadata"


def test_valid_additional_metadata() -> None:
    claim = make_claim(
        additionalPodMetadata={
            "labels": {"team.sandbox.users.io/x": "y"},
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", "a": "b"},
        }
    )
    claims.validate_additional_metadata(claim)


def test_ready_condition_is_forwarded_verbatim_with_the_claim_generation() -> None:
    status = claims.claim_status(make_claim(), warm(), error=None, expired=False, at=AT)
    (ready,) = status["conditions"]
    assert ready == {
        "type": "Ready",
        "status": "True",
        "reason": "DependenciesReady",
        "message": "Pod is Ready",
        "lastTransitionTime": "2025-12-31T23:00:00Z",
        "observedGeneration": 1,
    }
    assert status["sandbox"] == {"name": "pool-abcde", "podIPs": ["127.1.0.2"]}


def test_claim_error_reasons() -> None:
    claim = make_claim()
    err = claims.warm_pool_not_found(claim)
    status = claims.claim_status(claim, None, error=err, expired=False, at=AT)
    ready = status["conditions"][0]
    assert (ready["reason"], ready["message"]) == ("WarmPoolNotFound", 'SandboxWarmPool "pool" not found')
    tnf = claims.claim_status(claim, None, error=claims.template_not_found("t"), expired=False, at=AT)
    assert tnf["conditions"][0]["message"] == 'SandboxTemplate "t" not found'
    fresh = dict(warm())
    fresh["status"] = {}
    assert claims.ready_condition(claim, fresh, error=None, expired=False)["reason"] == "SandboxNotReady"
    assert claims.ready_condition(claim, None, error=None, expired=False)["reason"] == "SandboxMissing"
    assert claims.ready_condition(claim, None, error=None, expired=True)["reason"] == "ClaimExpired"


def test_error_never_clears_the_bound_sandbox() -> None:
    claim = make_claim()
    claim["status"] = {"sandbox": {"name": "pool-abcde"}}
    err = claims.ClaimError("ReconcilerError", "boom")
    status = claims.claim_status(claim, None, error=err, expired=False, at=AT)
    assert status["sandbox"] == {"name": "pool-abcde"}
    assert status["conditions"][0]["message"] == "Error seen: boom"


def test_expiry_is_the_earlier_of_shutdown_time_and_ttl_after_finished() -> None:
    claim = make_claim(lifecycle={"shutdownTime": "2026-01-01T01:00:00Z", "ttlSecondsAfterFinished": 60})
    assert claims.expire_at(claim) == datetime.datetime(2026, 1, 1, 1, tzinfo=datetime.UTC)
    claim["status"] = {
        "conditions": [{"type": "Finished", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }
    assert claims.expire_at(claim) == datetime.datetime(2026, 1, 1, 0, 1, tzinfo=datetime.UTC)
    assert claims.expire_at(make_claim()) is None
