"""Warm-pool rendering and the pool cache's pure decisions: what a generated pair looks like, the
shape read back from a template, and which pools may ever be matched."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import matching
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.fingerprints import SandboxShape, fingerprint
from warmshell.core.models import Storage
from warmshell.core.profiles import MAX_LIFETIME_SECONDS
from warmshell.drivers.kubernetes import labels
from warmshell.drivers.kubernetes.warm import poolcache, warmpools

from . import crds
from .fakes import NS, config

SHAPE = SandboxShape(
    workspace="team-a",
    image="ghcr.io/warmshell/warmshell:0.1.0",
    environment={"FOO": "bar"},
    cpu_millis=500,
    memory_bytes=2**30,
)


def pair(shape: SandboxShape = SHAPE, name: str = "foo", **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return warmpools.render_pool_pair(config(), name=name, namespace=NS, shape=shape, replicas=3, **kwargs)


def test_the_pair_validates_and_carries_the_fingerprint() -> None:
    template, pool = pair(extra_labels={"warmshell.dev/profile": "p1"})
    crds.validator("SandboxTemplate", "v1beta1").validate(template)
    crds.validator("SandboxWarmPool", "v1beta1").validate(pool)
    full = fingerprint(SHAPE)
    for obj in (template, pool):
        assert obj["metadata"]["labels"] == {
            "warmshell.dev/managed-by": "warmshell",
            "warmshell.dev/warm-pool": "enabled",
            "warmshell.dev/fingerprint": full[:40],
            "warmshell.dev/profile": "p1",
        }
    ours = {"warmshell.dev/fingerprint": full, "warmshell.dev/workspace": "team-a"}
    # No [storage] workspace: the key is there but empty, so removing it from a profile patches it away.
    assert template["metadata"]["annotations"] == {**ours, "warmshell.dev/workspace-size": ""}
    # No lifetime set: both keys are there but empty, so removing one from a profile patches it away.
    lifetime = {"warmshell.dev/ttl-seconds": "", "warmshell.dev/idle-timeout-seconds": ""}
    network = {"warmshell.dev/network-allow": "", "warmshell.dev/network-deny": "", "warmshell.dev/secret-hosts": ""}
    assert pool["metadata"]["annotations"] == {**ours, **lifetime, **network}
    assert pool["spec"] == {
        "replicas": 3,
        "sandboxTemplateRef": {"name": "foo"},
        "updateStrategy": {"type": "Recreate"},
    }


def test_a_profile_workspace_size_is_the_workspace_volume_size_limit() -> None:
    template, _ = pair(storage=Storage(workspace="2Gi", tmp="512Mi"))
    crds.validator("SandboxTemplate", "v1beta1").validate(template)
    volumes = {v["name"]: v for v in template["spec"]["podTemplate"]["spec"]["volumes"]}
    assert volumes["workspace"]["emptyDir"] == {"sizeLimit": "2Gi"}
    assert template["metadata"]["annotations"]["warmshell.dev/workspace-size"] == "2Gi"
    unbounded, _ = pair()
    assert {v["name"]: v for v in unbounded["spec"]["podTemplate"]["spec"]["volumes"]}["workspace"]["emptyDir"] == {}
    # Storage is the pool's, not the shape's: the shape read back (and so the match) is unchanged.
    assert warmpools.shape_of_template(template) == warmpools.shape_of_template(unbounded)


def test_a_gateway_with_workspace_claims_gives_every_member_one() -> None:
    cfg = config(workspace_claim_size="1Gi")
    template, _ = warmpools.render_pool_pair(
        cfg, name="foo", namespace=NS, shape=SHAPE, replicas=3, storage=Storage(workspace="3Gi")
    )
    crds.validator("SandboxTemplate", "v1beta1").validate(template)
    (claim,) = template["spec"]["volumeClaimTemplates"]
    assert (claim["metadata"]["name"], claim["spec"]["resources"]["requests"]["storage"]) == ("workspace", "3Gi")
    # The claim is the pool's storage, not the shape's: the match is unchanged.
    assert warmpools.shape_of_template(template) == warmpools.shape_of_template(pair()[0])


def test_the_template_has_no_identity_and_no_secrets() -> None:
    template, _ = pair()
    pod_template = template["spec"]["podTemplate"]
    assert labels.SANDBOX_ID not in pod_template["metadata"]["labels"]
    assert "annotations" not in pod_template["metadata"]
    assert labels.ACTIVATION_PROOF not in template["metadata"]["annotations"]
    assert pod_template["spec"]["automountServiceAccountToken"] is False
    # Unmanaged: the default policy would cut the supervisor off from the gateway.
    assert template["spec"]["networkPolicyManagement"] == "Unmanaged"


def test_extra_labels_cannot_override_ours() -> None:
    template, _ = pair(extra_labels={"warmshell.dev/warm-pool": "disabled"})
    assert template["metadata"]["labels"]["warmshell.dev/warm-pool"] == "enabled"


def test_reserved_environment_is_refused() -> None:
    with pytest.raises(ValueError, match="WARMSHELL_GATEWAY"):
        pair(SandboxShape(workspace="w", image="i", environment={"WARMSHELL_GATEWAY": "evil"}))


envs = st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), st.text(max_size=8), max_size=4)


@given(env=envs, cpu=st.sampled_from([0, 200, 1000, 1500]), memory=st.sampled_from([0, 2**30, 2**29, 10**9]))
def test_the_shape_read_back_has_the_same_fingerprint(env: dict[str, str], cpu: int, memory: int) -> None:
    env = {k: v for k, v in env.items() if not k.startswith("WARMSHELL_")}
    shape = SandboxShape(workspace="w", image="img:1", environment=env, cpu_millis=cpu, memory_bytes=memory)
    template, _ = pair(shape)
    read = warmpools.shape_of_template(template)
    assert read is not None
    assert fingerprint(read) == fingerprint(shape)


def test_quantities_read_from_a_template_become_amounts() -> None:
    # An operator may spell a template's requests any way Kubernetes accepts; the shape read
    # back carries amounts, so it matches the pool that asks for the same cpu and memory.
    template, _ = pair()
    (container,) = [c for c in template["spec"]["podTemplate"]["spec"]["containers"] if c["name"] == "workload"]
    container["resources"]["requests"] = {"cpu": "0.5", "memory": "1024Mi"}
    read = warmpools.shape_of_template(template)
    assert read is not None
    assert (read.cpu_millis, read.memory_bytes) == (500, 2**30)
    assert fingerprint(read) == fingerprint(SHAPE)
    container["resources"]["requests"] = {"cpu": "lots"}
    assert warmpools.shape_of_template(template) is None  # quantities that do not parse are not ours


def test_a_template_that_is_not_ours_has_no_shape() -> None:
    template, _ = pair()
    foreign = copy.deepcopy(template)
    foreign["spec"]["podTemplate"]["spec"]["containers"][0]["command"] = ["python", "app.py"]
    assert warmpools.shape_of_template(foreign) is None
    secret = copy.deepcopy(template)
    secret["spec"]["podTemplate"]["spec"]["containers"][0]["env"].append(
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    )
    assert warmpools.shape_of_template(secret) is None
    one_container = copy.deepcopy(template)  # the pod before the agent: supervisor and workload in one
    pod = one_container["spec"]["podTemplate"]["spec"]
    pod["containers"] = [c for c in pod["containers"] if c["name"] == "supervisor"]
    assert warmpools.shape_of_template(one_container) is None
    sneaky = copy.deepcopy(template)  # a workload that would not run the agent as its pid 1
    sneaky["spec"]["podTemplate"]["spec"]["containers"][1]["command"] = ["sh"]
    assert warmpools.shape_of_template(sneaky) is None


# -- the pool cache's decisions -----------------------------------------------------------------


def index(*pairs: tuple[dict[str, Any], dict[str, Any]]) -> list[poolcache.CachedPool]:
    templates = {t["metadata"]["name"]: poolcache.read_template(t) for t, _ in pairs if t}
    return poolcache.index_pools([p for _, p in pairs], templates)


def test_a_good_pool_is_servable() -> None:
    (entry,) = index(pair())
    assert entry.shape is not None
    assert entry.fingerprint == fingerprint(SHAPE)
    assert entry.workspace == "team-a"
    assert entry.problem is None


def test_a_pool_without_its_template_is_never_matched() -> None:
    _, pool = pair()
    (entry,) = index(({}, pool))
    assert entry.shape is None
    assert entry.problem is not None
    assert entry.problem.reason == "TemplateMissing"


def test_a_pool_whose_label_disagrees_with_its_template_is_never_matched() -> None:
    template, pool = pair()
    # The template was edited to run another environment; the labels still claim the old shape.
    template["spec"]["podTemplate"]["spec"]["containers"][0]["env"][-1]["value"] = "changed"
    (entry,) = index((template, pool))
    assert entry.shape is None
    assert entry.problem is not None
    assert entry.problem.reason == "FingerprintMismatch"
    found = matching.PoolIndex((e.fingerprint, e) for e in [entry] if e.shape is not None)
    assert isinstance(found.lookup(fingerprint(SHAPE)), matching.NoMatch)


def test_two_pools_with_one_fingerprint_are_ambiguous() -> None:
    entries = index(pair(name="one"), pair(name="two"))
    found = matching.PoolIndex((e.fingerprint, e) for e in entries if e.shape is not None)
    result = found.lookup(fingerprint(SHAPE))
    assert isinstance(result, matching.Ambiguous)
    assert {p.name for p in result.pools} == {"one", "two"}


def test_accepted_patterns_travel_on_the_pod_template_and_come_back_in_the_shape() -> None:
    shape = SandboxShape("default", "img", {"FOO": "bar"}, accepted=("RUN_?", "TASK_*"))
    template, _pool = warmpools.render_pool_pair(config(), name="p", namespace="ns", shape=shape, replicas=1)
    pod_template = template["spec"]["podTemplate"]
    assert pod_template["metadata"]["annotations"] == {labels.ACCEPTED_ENVIRONMENT: "RUN_?,TASK_*"}
    back = warmpools.shape_of_template(template)
    assert back is not None
    assert fingerprint(back) == fingerprint(shape)
    pod_template["metadata"]["annotations"][labels.ACCEPTED_ENVIRONMENT] = "FOO"  # baked and accepted
    assert warmpools.shape_of_template(template) is None
    pod_template["metadata"]["annotations"][labels.ACCEPTED_ENVIRONMENT] = "no spaces"
    assert warmpools.shape_of_template(template) is None


# -- lifetime defaults on the pool --------------------------------------------------------------


def test_the_lifetime_travels_on_the_pool_and_comes_back_in_the_cache() -> None:
    template, pool = pair(ttl_seconds=600, idle_timeout_seconds=0)
    assert pool["metadata"]["annotations"][labels.TTL_SECONDS] == "600"
    assert pool["metadata"]["annotations"][labels.IDLE_TIMEOUT_SECONDS] == "0"  # 0: no limit, not unset
    assert labels.TTL_SECONDS not in template["metadata"]["annotations"]
    assert warmpools.lifetime_of(pool) == (600, 0)
    (entry,) = index((template, pool))
    assert entry.problem is None
    assert (entry.ttl_seconds, entry.idle_timeout_seconds) == (600, 0)


def test_an_unset_or_absent_lifetime_is_none() -> None:
    template, pool = pair(ttl_seconds=30)
    assert warmpools.lifetime_of(pool) == (30, None)  # "" is unset
    del pool["metadata"]["annotations"][labels.TTL_SECONDS]  # an operator's pool without them
    del pool["metadata"]["annotations"][labels.IDLE_TIMEOUT_SECONDS]
    assert warmpools.lifetime_of(pool) == (None, None)
    (entry,) = index((template, pool))
    assert entry.shape is not None
    assert (entry.ttl_seconds, entry.idle_timeout_seconds) == (None, None)


@pytest.mark.parametrize("key", [labels.TTL_SECONDS, labels.IDLE_TIMEOUT_SECONDS])
@pytest.mark.parametrize("value", ["ten", "-5", "1.5", " 60", "٣", str(2**32), "1e3"])
def test_a_malformed_lifetime_is_a_pool_problem_naming_the_annotation(key: str, value: str) -> None:
    template, pool = pair(ttl_seconds=60, idle_timeout_seconds=60)
    pool["metadata"]["annotations"][key] = value
    with pytest.raises(InvalidArgumentError) as refused:
        warmpools.lifetime_of(pool)
    assert refused.value.field == f"annotation {key}"
    (entry,) = index((template, pool))
    assert entry.shape is None  # refused, never matched: not served without the lifetime asked for
    assert entry.problem is not None
    assert entry.problem.reason == "InvalidLifetime"
    assert key in entry.problem.message
    assert repr(value) in entry.problem.message


@given(st.one_of(st.text(max_size=12), st.integers(), st.none(), st.lists(st.integers(), max_size=2)))
def test_any_annotation_value_parses_or_is_refused_never_crashes(value: object) -> None:
    _, pool = pair()
    pool["metadata"]["annotations"][labels.TTL_SECONDS] = value
    well_formed = value is None or value == "" or (isinstance(value, str) and value.isascii() and value.isdigit())
    if well_formed and int(str(value or 0)) <= MAX_LIFETIME_SECONDS:
        ttl, _ = warmpools.lifetime_of(pool)
        assert ttl == (int(value) if value else None)
    else:
        with pytest.raises(InvalidArgumentError) as refused:
            warmpools.lifetime_of(pool)
        assert refused.value.field == f"annotation {labels.TTL_SECONDS}"


# -- network rules and secret hosts on the pool ---------------------------------------------------


def test_the_network_rules_travel_on_the_pool_and_come_back_in_the_cache() -> None:
    network = warmpools.PoolEgress(("pypi.example:443", "*.files.example"), ("10.0.0.0/8",), {"K": ("api.example?",)})
    template, pool = pair(network=network)
    assert warmpools.egress_of(pool) == network
    (entry,) = index((template, pool))
    assert entry.problem is None
    assert entry.network == network


def test_an_empty_allow_list_is_not_the_gateways_default() -> None:
    """`allow = []` in a profile allows nothing; no allow list at all leaves the default."""
    _, nothing = pair(network=warmpools.PoolEgress(allow=()))
    _, default = pair()
    assert warmpools.egress_of(nothing).allow == ()
    assert warmpools.egress_of(default).allow is None
    for key in (labels.NETWORK_ALLOW, labels.NETWORK_DENY, labels.SECRET_HOSTS):
        del default["metadata"]["annotations"][key]  # an operator's pool without them
    assert warmpools.egress_of(default) == warmpools.PoolEgress()


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        (labels.NETWORK_ALLOW, "pypi.example", "must be a JSON list"),
        (labels.NETWORK_ALLOW, '["*.com"]', "public suffix"),
        (labels.NETWORK_DENY, "[1, 2]", "strings"),
        (labels.NETWORK_DENY, '["host:99999"]', "port"),
        (labels.SECRET_HOSTS, '["api.example"]', "must be a JSON object"),
        (labels.SECRET_HOSTS, '{"K": []}', "non-empty list"),
        (labels.SECRET_HOSTS, '{"K": ["10.0.0.0/8"]}', "network, not a host"),
    ],
)
def test_malformed_network_annotations_are_a_pool_problem_naming_the_annotation(
    key: str, value: str, says: str
) -> None:
    template, pool = pair(network=warmpools.PoolEgress(allow=("ok.example",)))
    pool["metadata"]["annotations"][key] = value
    with pytest.raises(InvalidArgumentError) as refused:
        warmpools.egress_of(pool)
    assert refused.value.field.startswith(f"annotation {key}")
    assert says in str(refused.value)
    (entry,) = index((template, pool))
    assert entry.shape is None  # refused, never matched: not served under another policy
    assert entry.problem is not None
    assert entry.problem.reason == "InvalidNetwork"
