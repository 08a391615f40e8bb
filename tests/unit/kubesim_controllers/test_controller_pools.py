import copy
from typing import Any

import pytest
from ksc_builders import make_pool, make_template

from kubesim import timing
from kubesim.controllers import client as kc
from kubesim.controllers import pools
from kubesim.controllers.hashing import name_hash
from kubesim.controllers.informer import Informer
from kubesim.controllers.warmpool import WarmPoolController

Obj = dict[str, Any]


def member(name: str, *, ready: bool = True, deleting: bool = False, created: str = "") -> Obj:
    sb = pools.build_warm_sandbox(make_pool(), make_template())
    sb["metadata"].update({"name": name, "uid": f"{name}-uid", "creationTimestamp": created or "2026-01-01T00:00:00Z"})
    if deleting:
        sb["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z"
    sb["status"] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return sb


def test_warm_sandbox_shape() -> None:
    sb = pools.build_warm_sandbox(make_pool(), make_template())
    meta = sb["metadata"]
    assert meta["generateName"] == "pool-"
    assert "name" not in meta
    labels = meta["labels"]
    assert labels["agents.x-k8s.io/warm-pool-sandbox"] == name_hash("pool")
    assert labels["agents.x-k8s.io/sandbox-template-ref-hash"] == name_hash("tmpl")
    assert labels["agents.x-k8s.io/launch-type"] == "warm"
    assert labels["agents.x-k8s.io/created-by"] == "controller"
    pod_hash, bp_hash = pools.template_hashes(make_template())
    assert labels["agents.x-k8s.io/sandbox-pod-template-hash"] == pod_hash
    assert labels["agents.x-k8s.io/sandbox-template-hash"] == bp_hash
    assert meta["annotations"] == {"agents.x-k8s.io/sandbox-template-ref": "tmpl"}
    assert meta["ownerReferences"][0]["kind"] == "SandboxWarmPool"
    assert meta["ownerReferences"][0]["controller"] is True
    ptmeta = sb["spec"]["podTemplate"]["metadata"]
    assert ptmeta["labels"]["app"] == "agent"
    assert ptmeta["labels"]["agents.x-k8s.io/sandbox-template-hash"] == bp_hash
    assert ptmeta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    assert sb["spec"]["podTemplate"]["spec"]["dnsConfig"] == {"nameservers": ["8.8.8.8", "1.1.1.1"]}


def test_template_set_safe_to_evict_and_dns_policy_are_kept() -> None:
    tmpl = make_template()
    tmpl["spec"]["podTemplate"]["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] = "false"
    tmpl["spec"]["podTemplate"]["spec"]["dnsPolicy"] = "ClusterFirst"
    tmpl["spec"]["podTemplate"]["spec"]["automountServiceAccountToken"] = True
    sb = pools.build_warm_sandbox(make_pool(), tmpl)
    spec = sb["spec"]["podTemplate"]["spec"]
    assert spec["dnsPolicy"] == "ClusterFirst"
    assert "dnsConfig" not in spec
    assert spec["automountServiceAccountToken"] is True
    ann = sb["spec"]["podTemplate"]["metadata"]["annotations"]
    assert ann["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_plan_creates_deficit_counting_terminating_members() -> None:
    members = [member("a"), member("b", deleting=True)]
    plan = pools.plan_pool(make_pool(replicas=4), members, make_template(), unobserved=0)
    assert plan.create == 2
    assert plan.status == {
        "replicas": 1,
        "readyReplicas": 1,
        "selector": f"agents.x-k8s.io/warm-pool-sandbox={name_hash('pool')}",
        "observedGeneration": 4,
    }


def test_plan_waits_for_unobserved_writes() -> None:
    plan = pools.plan_pool(make_pool(replicas=4), [], make_template(), unobserved=1)
    assert plan.create == 0
    assert plan.delete == []


def test_missing_template_creates_nothing_but_reports_status() -> None:
    plan = pools.plan_pool(make_pool(replicas=3), [member("a")], None, unobserved=0)
    assert plan.create == 0
    assert plan.status["replicas"] == 1


def test_members_owned_by_someone_else_do_not_count() -> None:
    adopted = member("a")
    adopted["metadata"]["ownerReferences"][0]["uid"] = "claim-uid"
    plan = pools.plan_pool(make_pool(replicas=1), [adopted], make_template(), unobserved=0)
    assert plan.create == 1


def test_scale_down_removes_unready_then_newest() -> None:
    members = [
        member("old", created="2026-01-01T00:00:01Z"),
        member("new", created="2026-01-01T00:00:05Z"),
        member("unready", ready=False, created="2026-01-01T00:00:00Z"),
    ]
    plan = pools.plan_pool(make_pool(replicas=1), members, make_template(), unobserved=0)
    assert [m["metadata"]["name"] for m in plan.delete] == ["unready", "new"]


def test_recreate_deletes_stale_members_on_replenish_keeps_them() -> None:
    changed = make_template()
    changed["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "busybox:2"
    members = [member("a"), member("b")]
    keep = pools.plan_pool(make_pool(replicas=2), members, changed, unobserved=0)
    assert keep.delete == []
    assert keep.create == 0
    recreate_pool = make_pool(replicas=2)
    recreate_pool["spec"]["updateStrategy"] = {"type": "Recreate"}
    plan = pools.plan_pool(recreate_pool, members, changed, unobserved=0)
    assert {m["metadata"]["name"] for m in plan.delete} == {"a", "b"}
    assert plan.create == 2


def test_metadata_only_template_change_is_not_stale() -> None:
    changed = make_template()
    changed["spec"]["podTemplate"]["metadata"]["labels"]["extra"] = "x"
    assert not pools.is_stale(member("a"), changed)
    assert pools.is_stale(member("a"), make_template(name="other"))


def test_members_stuck_not_ready_past_the_grace_period_are_replaced() -> None:
    import datetime

    now = datetime.datetime(2026, 1, 1, 0, 10, tzinfo=datetime.UTC)
    stuck = member("stuck", ready=False, created="2026-01-01T00:00:00Z")
    young = member("young", ready=False, created="2026-01-01T00:09:00Z")
    plan = pools.plan_pool(
        make_pool(replicas=2), [stuck, young], make_template(), unobserved=0, now=now, readiness_grace=300
    )
    assert [m["metadata"]["name"] for m in plan.delete] == ["stuck"]
    assert plan.create == 1
    assert plan.recheck_in == 240


def test_a_member_write_is_planned_only_when_what_the_plan_reads_changes() -> None:
    from kubesim.controllers import warmpool

    before = member("a", ready=False)
    message_only = copy.deepcopy(before)
    message_only["status"]["conditions"][0]["message"] = "pod scheduled"
    assert warmpool._as_planned(message_only) == warmpool._as_planned(before)
    for change in (
        lambda sb: sb["status"]["conditions"][0].update(status="True"),
        lambda sb: sb["metadata"].update(deletionTimestamp="2026-01-01T00:00:09Z"),
        lambda sb: sb["metadata"]["labels"].pop("agents.x-k8s.io/warm-pool-sandbox"),
        lambda sb: sb["metadata"].update(ownerReferences=[]),
        lambda sb: sb["metadata"].update(generation=2),
    ):
        after = copy.deepcopy(before)
        change(after)
        assert warmpool._as_planned(after) != warmpool._as_planned(before)


def test_the_pool_controller_compares_with_its_own_last_status_write_and_skips_its_echo() -> None:
    from kubesim.controllers.warmpool import _newest, _own_echo

    cached = {"metadata": {"uid": "u", "resourceVersion": "7"}, "status": {"replicas": 2}}
    written = {"metadata": {"uid": "u", "resourceVersion": "9"}, "status": {"replicas": 1}}
    assert _newest(cached, written) is written  # the informer has not seen our write yet
    later = {"metadata": {"uid": "u", "resourceVersion": "12"}, "status": {"replicas": 3}}
    assert _newest(later, written) is later
    recreated = {"metadata": {"uid": "v", "resourceVersion": "15"}, "status": {}}
    assert _newest(recreated, written) is recreated  # another pool of the same name
    assert _newest(cached, None) is cached
    assert _own_echo({"metadata": {"uid": "u", "resourceVersion": "9"}}, written)
    assert not _own_echo(later, written)
    assert not _own_echo(written, None)


async def test_the_pool_controller_reads_a_member_once_per_version(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes = Informer(None, kc.SANDBOXES, watch_timeout=1)  # type: ignore[arg-type]  # fed by hand
    controller = WarmPoolController(
        None,  # type: ignore[arg-type]  # no reconcile here: no pool in its informer
        pools_informer=Informer(None, kc.POOLS, watch_timeout=1),  # type: ignore[arg-type]
        sandboxes=sandboxes,
        templates=Informer(None, kc.TEMPLATES, watch_timeout=1),  # type: ignore[arg-type]
        timing=timing.FAST,
    )
    reads: list[str] = []
    read = pools.member_facts

    def counted(sandbox: Obj) -> pools.MemberFacts:
        reads.append(sandbox["metadata"]["resourceVersion"])
        return read(sandbox)

    monkeypatch.setattr(pools, "member_facts", counted)
    versions = [member("a", ready=False), member("a", ready=True), member("a", deleting=True)]
    for rv, version in enumerate(versions, start=1):
        version["metadata"].update({"namespace": "ns1", "resourceVersion": str(rv)})
        sandboxes._apply("ADDED" if rv == 1 else "MODIFIED", version)
        cached = sandboxes.get("ns1", "a")
        assert cached is not None
        first, again = controller._facts_of(cached), controller._facts_of(cached)
        assert first == again == read(version)
    assert reads == ["1", "2", "3"], "each version is read once, and a new version is read anew"
    sandboxes._apply("DELETED", versions[-1])
    assert controller._facts == {}
