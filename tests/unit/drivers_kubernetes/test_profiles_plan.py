"""The profile reconciler's pure decisions: names, the desired pair of a ConfigMap, the plan
(create, patch, supersede, orphan, keep on error) and the status annotations."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.config import KubernetesDriverConfig
from warmshell.drivers.kubernetes import labels
from warmshell.drivers.kubernetes.profiles import profileplan
from warmshell.drivers.kubernetes.warm import warmpools

from .fakes import NS, config

Obj = dict[str, Any]

DEFAULT = 'version = 1\nworkspace = "default"\nreplicas = 2\n'
ENV = DEFAULT + '[environment]\nFOO = "bar"\n'


def configmap(name: str = "wp-default", text: str | None = DEFAULT, *, uid: str = "", rv: str = "10") -> Obj:
    data = {} if text is None else {labels.PROFILE_DATA_KEY: text}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
            "labels": {labels.PROFILE: "true"},
        },
        "data": data,
    }


def cfg(**overrides: Any) -> KubernetesDriverConfig:
    return config(**overrides)


def existing(obj: Obj | None, uid: str = "obj-uid") -> Obj:
    assert obj is not None
    return {**obj, "metadata": {**obj["metadata"], "uid": uid, "resourceVersion": "5"}}


# -- names --------------------------------------------------------------------------------------------


def test_generated_name_has_prefix_profile_and_hash() -> None:
    assert profileplan.generated_name("wp-default", "abcdef0123" + "0" * 54) == "warmshell-wp-wp-default-abcdef01"


def test_generated_name_sanitises_and_falls_back() -> None:
    assert profileplan.generated_name("My.Profile__X", "f" * 64) == "warmshell-wp-my-profile-x-ffffffff"
    assert profileplan.generated_name("...", "f" * 64) == "warmshell-wp-profile-ffffffff"


@given(st.text(max_size=200), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))
def test_generated_name_is_always_a_dns_label(profile: str, fingerprint: str) -> None:
    name = profileplan.generated_name(profile, fingerprint)
    assert len(name) <= 63
    assert profileplan.sanitize(name) == name
    assert name.endswith(fingerprint[:8])


# -- desire ---------------------------------------------------------------------------------------------


def test_a_valid_profile_renders_a_labelled_pair_owned_by_its_configmap() -> None:
    want = profileplan.desire(configmap(), cfg())
    assert want.error == ""
    assert want.template is not None
    assert want.pool is not None
    assert want.generated == f"warmshell-wp-wp-default-{want.fingerprint[:8]}"
    assert want.target_namespace == NS
    for obj in (want.template, want.pool):
        meta = obj["metadata"]
        assert meta["name"] == want.generated
        assert meta["labels"][labels.PROFILE_NAME] == "wp-default"
        assert meta["labels"][labels.PROFILE_UID] == "uid-wp-default"
        assert meta["labels"][labels.WARM_POOL] == labels.WARM_POOL_ENABLED
        assert meta["annotations"][labels.FINGERPRINT] == want.fingerprint
        assert meta["annotations"][labels.PROFILE_SOURCE] == f"{NS}/wp-default"
        (owner,) = meta["ownerReferences"]
        assert owner == {"apiVersion": "v1", "kind": "ConfigMap", "name": "wp-default", "uid": "uid-wp-default"}
    assert want.pool["spec"]["replicas"] == 2


def test_the_profile_fingerprint_is_the_one_create_requests_compute() -> None:
    from warmshell.core.fingerprints import SandboxShape, fingerprint

    want = profileplan.desire(configmap(text=ENV), cfg())
    shape = SandboxShape(workspace="default", image=cfg().image, environment={"FOO": "bar"})
    assert want.fingerprint == fingerprint(shape)


def test_replicas_are_capped_and_the_status_says_so() -> None:
    settings = cfg(warm_pooling={"profiles": {"enabled": True, "max_replicas": 3}})
    want = profileplan.desire(configmap(text=DEFAULT.replace("replicas = 2", "replicas = 50")), settings)
    assert want.pool is not None
    assert want.pool["spec"]["replicas"] == 3
    status = profileplan.status_annotations(want, observed="10")
    assert status[labels.PROFILE_STATUS] == "Ready"
    assert "50 capped to 3" in str(status[labels.PROFILE_LAST_ERROR])


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (None, "data key 'warm-pool.toml' is missing"),
        ("version = 1\nworkspace = ", "not valid TOML"),
        ('version = 2\nworkspace = "default"\nreplicas = 1\n', "version: must be 1"),
        ('version = 1\nworkspace = "default"\nreplicas = 1\ncolour = "red"\n', "colour: unknown key"),
        ('version = 1\nworkspace = "default"\nreplicas = 1\n[resources]\ncpu = "lots"\n', "resources.cpu"),
        (DEFAULT + '[setup]\nfrom = "t:1"\nrun = ["make"]\n', "setup: is served by the local driver only"),
    ],
)
def test_an_invalid_profile_is_an_error_in_words_naming_the_configmap(text: str | None, fragment: str) -> None:
    want = profileplan.desire(configmap(text=text), cfg())
    assert want.template is None
    assert fragment in want.error
    assert f"configmap {NS}/wp-default" in want.error


# -- plan ---------------------------------------------------------------------------------------------------


def test_nothing_exists_so_template_then_pool_are_created() -> None:
    want = profileplan.desire(configmap(), cfg())
    result = profileplan.plan([want], [], [])
    assert [(w.action, w.kind) for w in result.writes] == [("create", "template"), ("create", "pool")]
    assert result.deletes == []


def test_an_up_to_date_pair_needs_nothing_even_with_api_defaults_added() -> None:
    want = profileplan.desire(configmap(), cfg())
    template = existing(want.template)
    template["metadata"]["labels"] = {
        **template["metadata"]["labels"],
        "agents.x-k8s.io/sandbox-template-ref-hash": "1",
    }
    template["spec"] = {**template["spec"], "envVarsInjectionPolicy": "Disallowed"}
    pool = existing(want.pool)
    result = profileplan.plan([want], [template], [pool])
    assert result.writes == []
    assert result.deletes == []


def test_a_pool_that_keeps_stale_members_is_patched_to_replace_them() -> None:
    """A pool written before the pod's shape changed (OnReplenish) is patched to Recreate, so its
    idle members of the old shape are replaced at once."""
    want = profileplan.desire(configmap(), cfg())
    pool = existing(want.pool)
    pool["spec"] = {**pool["spec"], "updateStrategy": {"type": "OnReplenish"}}
    (write,) = profileplan.plan([want], [existing(want.template)], [pool]).writes
    assert (write.action, write.kind) == ("patch", "pool")
    assert profileplan.patch_body(write)["spec"]["updateStrategy"] == {"type": "Recreate"}


def test_a_replicas_change_patches_the_pool_in_place() -> None:
    old = profileplan.desire(configmap(), cfg())
    new = profileplan.desire(configmap(text=DEFAULT.replace("replicas = 2", "replicas = 4"), rv="11"), cfg())
    assert new.generated == old.generated
    result = profileplan.plan([new], [existing(old.template)], [existing(old.pool)])
    assert [(w.action, w.kind) for w in result.writes] == [("patch", "pool")]
    assert profileplan.patch_body(result.writes[0])["spec"]["replicas"] == 4


def test_a_lifetime_change_patches_the_pool_in_place_and_removing_it_clears_it() -> None:
    lifetime = DEFAULT + "[lifetime]\nttl_seconds = 600\nidle_timeout_seconds = 120\n"
    old = profileplan.desire(configmap(text=lifetime), cfg())
    assert old.pool is not None
    assert old.pool["metadata"]["annotations"][labels.TTL_SECONDS] == "600"
    assert old.pool["metadata"]["annotations"][labels.IDLE_TIMEOUT_SECONDS] == "120"
    new = profileplan.desire(configmap(rv="11"), cfg())  # [lifetime] removed
    assert new.generated == old.generated  # not part of the shape: the same pool
    result = profileplan.plan([new], [existing(old.template)], [existing(old.pool)])
    assert [(w.action, w.kind) for w in result.writes] == [("patch", "pool")]
    annotations = profileplan.patch_body(result.writes[0])["metadata"]["annotations"]
    assert (annotations[labels.TTL_SECONDS], annotations[labels.IDLE_TIMEOUT_SECONDS]) == ("", "")


def test_network_rules_and_secret_hosts_patch_the_pool_in_place_and_removing_them_clears_them() -> None:
    rules = DEFAULT + '[network]\nallow = ["pypi.example:443"]\ndeny = ["10.0.0.0/8"]\n'
    rules += '[activation]\nsecret_hosts = { API_KEY = ["api.example.com"] }\n'
    old = profileplan.desire(configmap(text=rules), cfg())
    plain = profileplan.desire(configmap(rv="11"), cfg())  # both removed
    assert old.pool is not None
    assert plain.generated == old.generated  # not part of the shape: the same pool, its members kept
    assert warmpools.egress_of(old.pool) == warmpools.PoolEgress(
        ("pypi.example:443",), ("10.0.0.0/8",), {"API_KEY": ("api.example.com",)}
    )
    result = profileplan.plan([plain], [existing(old.template)], [existing(old.pool)])
    assert [(w.action, w.kind) for w in result.writes] == [("patch", "pool")]
    annotations = profileplan.patch_body(result.writes[0])["metadata"]["annotations"]
    keys = (labels.NETWORK_ALLOW, labels.NETWORK_DENY, labels.SECRET_HOSTS)
    assert [annotations[key] for key in keys] == ["", "", ""]
    assert warmpools.egress_of(result.writes[0].body) == warmpools.PoolEgress()


def _workspace_volume(template: Obj | None) -> Obj:
    assert template is not None
    (volume,) = [v for v in template["spec"]["podTemplate"]["spec"]["volumes"] if v["name"] == "workspace"]
    return dict(volume["emptyDir"])


def test_a_storage_change_patches_the_template_in_place_and_removing_it_clears_it() -> None:
    sized = DEFAULT + '[storage]\nworkspace = "2048Mi"\n'
    old = profileplan.desire(configmap(), cfg())
    new = profileplan.desire(configmap(text=sized, rv="11"), cfg())
    assert new.generated == old.generated  # not part of the shape: the same pool
    assert _workspace_volume(new.template) == {"sizeLimit": "2Gi"}  # in normal form
    grown = profileplan.plan([new], [existing(old.template)], [existing(old.pool)])
    assert [(w.action, w.kind) for w in grown.writes] == [("patch", "template")]
    assert _workspace_volume(profileplan.patch_body(grown.writes[0])) == {"sizeLimit": "2Gi"}
    # Removed again: the old template's sizeLimit alone would look up to date; the annotation is not.
    removed = profileplan.plan([old], [existing(new.template)], [existing(new.pool)])
    assert [(w.action, w.kind) for w in removed.writes] == [("patch", "template")]
    body = profileplan.patch_body(removed.writes[0])
    assert _workspace_volume(body) == {}
    assert body["metadata"]["annotations"][labels.WORKSPACE_SIZE] == ""


def test_a_changed_shape_creates_a_new_pair_and_deletes_the_superseded_one() -> None:
    old = profileplan.desire(configmap(), cfg())
    new = profileplan.desire(configmap(text=ENV, rv="11"), cfg())
    assert new.generated != old.generated
    result = profileplan.plan([new], [existing(old.template, "t1")], [existing(old.pool, "p1")])
    assert [(w.action, w.kind, w.name) for w in result.writes] == [
        ("create", "template", new.generated),
        ("create", "pool", new.generated),
    ]
    assert [(d.kind, d.name, d.uid) for d in result.deletes] == [
        ("pool", old.generated, "p1"),
        ("template", old.generated, "t1"),
    ]
    assert all(d.reason.startswith("superseded") for d in result.deletes)
    assert {d.profile_uid for d in result.deletes} == {"uid-wp-default"}


def test_pairs_of_a_deleted_profile_are_orphans_and_deleted() -> None:
    gone = profileplan.desire(configmap("wp-gone"), cfg())
    result = profileplan.plan([], [existing(gone.template)], [existing(gone.pool)])
    assert [d.kind for d in result.deletes] == ["pool", "template"]
    assert all(d.reason.startswith("orphaned") for d in result.deletes)


def test_an_invalid_profile_keeps_its_working_pair_and_others_proceed() -> None:
    good = profileplan.desire(configmap(), cfg())
    broken_before = profileplan.desire(configmap("wp-env", ENV), cfg())
    broken_now = profileplan.desire(configmap("wp-env", "version = 1\nworkspace = "), cfg())
    result = profileplan.plan([good, broken_now], [existing(broken_before.template)], [existing(broken_before.pool)])
    assert [(w.action, w.name) for w in result.writes] == [("create", good.generated), ("create", good.generated)]
    assert result.deletes == []
    assert result.kept == {"uid-wp-env": [broken_before.generated]}
    status = profileplan.status_annotations(broken_now, kept=result.kept["uid-wp-env"], observed="10")
    assert status[labels.PROFILE_STATUS] == "Error"
    message = str(status[labels.PROFILE_LAST_ERROR])
    assert "not valid TOML" in message
    assert f"keeping the previously generated {broken_before.generated}" in message


def test_a_recreated_configmap_takes_over_its_namesakes_pair_instead_of_deleting_it() -> None:
    old = profileplan.desire(configmap(uid="old-uid"), cfg())
    new = profileplan.desire(configmap(uid="new-uid"), cfg())
    result = profileplan.plan([new], [existing(old.template)], [existing(old.pool)])
    assert result.deletes == []
    assert [(w.action, w.kind) for w in result.writes] == [("patch", "template"), ("patch", "pool")]


def test_two_profiles_generating_one_name_do_not_fight() -> None:
    # Profile names are DNS labels, so this cannot happen today; the plan still refuses it.
    first = profileplan.desire(configmap("wp-a"), cfg())
    second = dataclasses.replace(first, name="wp-b", uid="uid-wp-b")
    result = profileplan.plan([first, second], [], [])
    assert {w.profile_uid for w in result.writes} == {"uid-wp-a"}
    assert "already generates" in result.errors["uid-wp-b"]


# -- status -------------------------------------------------------------------------------------------------


def test_ready_status_names_everything_and_clears_the_last_error() -> None:
    want = profileplan.desire(configmap(), cfg())
    status = profileplan.status_annotations(want, observed="10")
    assert status == {
        labels.PROFILE_STATUS: "Ready",
        labels.PROFILE_LAST_ERROR: None,
        labels.PROFILE_OBSERVED_VERSION: "10",
        labels.PROFILE_TARGET_NAMESPACE: NS,
        labels.PROFILE_GENERATED: want.generated,
        labels.PROFILE_FINGERPRINT: want.fingerprint,
    }


def test_status_patch_only_when_something_changed() -> None:
    want = profileplan.desire(configmap(), cfg())
    status = profileplan.status_annotations(want, observed="10")
    patch = profileplan.status_patch(want, status)
    assert patch is not None
    assert patch["metadata"]["annotations"][labels.PROFILE_STATUS] == "Ready"
    assert labels.PROFILE_LAST_ERROR not in patch["metadata"]["annotations"]  # absent already
    annotated = configmap()
    annotated["metadata"]["annotations"] = {k: v for k, v in status.items() if v is not None}
    assert profileplan.status_patch(profileplan.desire(annotated, cfg()), status) is None


def test_our_own_status_write_does_not_change_the_observed_version() -> None:
    annotated = configmap(rv="12")
    annotated["metadata"]["annotations"] = {labels.PROFILE_OBSERVED_VERSION: "10"}
    want = profileplan.desire(annotated, cfg())
    assert profileplan.observed_version(want, own_write="12") == "10"
    assert profileplan.observed_version(want, own_write="11") == "12"
    assert profileplan.observed_version(want, own_write=None) == "12"
