from typing import Any

from ksc_builders import make_claim, make_pool, make_template

from kubesim.controllers import candidates, pools

Obj = dict[str, Any]


def member(name: str, *, ready: bool, ips: bool = True) -> Obj:
    sb = pools.build_warm_sandbox(make_pool(), make_template())
    sb["metadata"].update({"name": name, "uid": f"{name}-uid", "resourceVersion": "1"})
    sb["status"] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ips:
        sb["status"]["podIPs"] = ["127.1.0.9"]
    return sb


def queue_of(*members: Obj) -> candidates.WarmQueue:
    queue = candidates.WarmQueue()
    for m in members:
        queue.observe("ADDED", m)
    return queue


def pick(queue: candidates.WarmQueue, members: list[Obj]) -> tuple[str | None, bool]:
    by_name = {m["metadata"]["name"]: m for m in members}
    chosen, pending = candidates.pick_candidate(queue, make_claim(), make_template(), by_name.get, recreate=False)
    return (chosen["metadata"]["name"] if chosen else None), pending


def test_ready_member_is_preferred_over_older_not_ready_ones() -> None:
    members = [member("a", ready=False), member("b", ready=True)]
    queue = queue_of(*members)
    assert pick(queue, members) == ("b", False)
    # The not-Ready one is kept for later claims.
    assert pick(queue, members) == ("a", False)
    assert pick(queue, members) == (None, False)


def test_ip_less_members_make_the_claim_wait_and_stay_queued() -> None:
    members = [member("a", ready=False, ips=False)]
    queue = queue_of(*members)
    assert pick(queue, members) == (None, True)
    assert len(queue) == 1


def test_deleted_or_adopted_members_leave_the_queue() -> None:
    a, b = member("a", ready=True), member("b", ready=True)
    queue = queue_of(a, b)
    adopted = dict(a)
    adopted["metadata"] = {**a["metadata"], "ownerReferences": [{"kind": "SandboxClaim", "controller": True}]}
    queue.observe("MODIFIED", adopted)
    queue.observe("DELETED", b)
    assert len(queue) == 0


def test_no_member_is_handed_out_twice() -> None:
    members = [member(f"m{i}", ready=True) for i in range(5)]
    queue = queue_of(*members)
    picked = [pick(queue, members)[0] for _ in range(7)]
    assert picked[:5] == ["m0", "m1", "m2", "m3", "m4"]
    assert picked[5:] == [None, None]


def test_stale_members_are_skipped_under_recreate() -> None:
    members = [member("old", ready=True)]
    changed = make_template()
    changed["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "busybox:2"
    chosen, _ = candidates.pick_candidate(
        queue_of(*members), make_claim(), changed, {"old": members[0]}.get, recreate=True
    )
    assert chosen is None
