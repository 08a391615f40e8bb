"""One reconciler pass against an in-memory API (real create/patch/delete semantics), and the
extension-API gate: one warning while absent, on again when they appear."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from warmshell.drivers.kubernetes import kube, labels
from warmshell.drivers.kubernetes.profiles import profileplan
from warmshell.drivers.kubernetes.profiles import reconciler as profiles
from warmshell.drivers.kubernetes.warm.extensions import ExtensionsGate

from .clocks import FakeClock, settle
from .fakes import NS, config
from .test_profiles_plan import DEFAULT, ENV, configmap

Obj = dict[str, Any]


def merge(target: Obj, patch: Obj) -> Obj:
    """RFC 7386 JSON merge patch."""
    result = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def matches(obj: Obj, selector: str) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if key not in have or ("=" in term and have[key] != value):
            return False
    return True


class FakeApi:
    """Objects by (plural, namespace, name); `extensions=False` makes the CRDs absent."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.versions = itertools.count(100)
        self.extensions = True
        self.writes: list[tuple[str, str, str]] = []
        self.rejected: set[str] = set()  # names whose writes answer 422

    def _absent(self, resource: kube.Resource) -> None:
        if resource.group == kube.EXTENSIONS_GROUP and not self.extensions:
            raise kube.NotFound(404, "NotFound", "the server could not find the requested resource")

    def _stamp(self, obj: Obj) -> Obj:
        obj["metadata"]["resourceVersion"] = str(next(self.versions))
        return copy.deepcopy(obj)

    def put(self, resource: kube.Resource, obj: Obj) -> Obj:
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        self.objects[(resource.plural, meta["namespace"], meta["name"])] = copy.deepcopy(obj)
        return self._stamp(self.objects[(resource.plural, meta["namespace"], meta["name"])])

    def items(self, resource: kube.Resource) -> list[Obj]:
        return [o for (plural, _, _), o in sorted(self.objects.items()) if plural == resource.plural]

    async def list(self, resource: kube.Resource, namespace: str, *, label_selector: str = "", limit: int = 0) -> Obj:
        self._absent(resource)
        found = [
            copy.deepcopy(o)
            for (plural, ns, _), o in sorted(self.objects.items())
            if plural == resource.plural and ns == namespace and matches(o, label_selector)
        ]
        return {"metadata": {"resourceVersion": "1"}, "items": found}

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> Obj:
        self._absent(resource)
        try:
            return copy.deepcopy(self.objects[(resource.plural, namespace, name)])
        except KeyError:
            raise kube.NotFound(404, "NotFound", f"{name} not found") from None

    async def create(self, resource: kube.Resource, namespace: str, body: Obj) -> Obj:
        self._absent(resource)
        name = body["metadata"]["name"]
        if name in self.rejected:
            raise kube.Rejected(422, "Invalid", f"{resource.kind} {name} is invalid: spec: bad")
        if (resource.plural, namespace, name) in self.objects:
            raise kube.AlreadyExists(409, "AlreadyExists", "exists")
        self.writes.append(("create", resource.plural, name))
        return self.put(resource, copy.deepcopy(body))

    async def merge_patch(self, resource: kube.Resource, namespace: str, name: str, patch: Obj) -> Obj:
        self._absent(resource)
        key = (resource.plural, namespace, name)
        if key not in self.objects:
            raise kube.NotFound(404, "NotFound", f"{name} not found")
        self.writes.append(("patch", resource.plural, name))
        self.objects[key] = merge(self.objects[key], patch)
        return self._stamp(self.objects[key])

    async def watch(
        self, resource: kube.Resource, namespace: str, *, resource_version: str, label_selector: str = ""
    ) -> AsyncGenerator[Obj, None]:
        """A watch on which nothing happens (tests drive changes through passes)."""
        await asyncio.Event().wait()
        yield {}

    async def delete(self, resource: kube.Resource, namespace: str, name: str, *, uid: str = "") -> Obj:
        key = (resource.plural, namespace, name)
        if key not in self.objects:
            raise kube.NotFound(404, "NotFound", f"{name} not found")
        if uid and self.objects[key]["metadata"]["uid"] != uid:
            raise kube.Conflict(409, "Conflict", "uid precondition failed")
        self.writes.append(("delete", resource.plural, name))
        return self.objects.pop(key)


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


def reconciler(api: FakeApi, **overrides: Any) -> profiles.ProfileReconciler:
    settings = config(warm_pooling={"profiles": {"enabled": True}}, **overrides)
    gate = ExtensionsGate(api, NS, clock=FakeClock())  # type: ignore[arg-type]
    return profiles.ProfileReconciler(api, settings, gate=gate)  # type: ignore[arg-type]


async def run_pass(api: FakeApi, rec: profiles.ProfileReconciler) -> None:
    rec._on_list([o for o in api.items(kube.CONFIGMAPS) if matches(o, labels.profile_selector())])
    await rec.reconcile_once()


def annotations(api: FakeApi, name: str) -> dict[str, str]:
    return dict(api.objects[("configmaps", NS, name)]["metadata"].get("annotations") or {})


def pools(api: FakeApi) -> list[str]:
    return [o["metadata"]["name"] for o in api.items(kube.SANDBOX_WARM_POOLS)]


async def test_a_pass_creates_pairs_and_reports_ready(api: FakeApi) -> None:
    api.put(kube.CONFIGMAPS, configmap("wp-default"))
    api.put(kube.CONFIGMAPS, configmap("wp-env", ENV))
    rec = reconciler(api)
    await run_pass(api, rec)
    status = annotations(api, "wp-default")
    assert status[labels.PROFILE_STATUS] == "Ready"
    assert sorted(pools(api)) == sorted(
        [status[labels.PROFILE_GENERATED], annotations(api, "wp-env")[labels.PROFILE_GENERATED]]
    )
    assert [o["metadata"]["name"] for o in api.items(kube.SANDBOX_TEMPLATES)] == pools(api)


async def test_a_second_pass_writes_nothing(api: FakeApi) -> None:
    api.put(kube.CONFIGMAPS, configmap("wp-default"))
    rec = reconciler(api)
    await run_pass(api, rec)
    before = len(api.writes)
    await run_pass(api, rec)
    await run_pass(api, rec)
    assert api.writes[before:] == []


async def test_an_edit_replaces_the_pair_and_a_delete_sweeps_it(api: FakeApi) -> None:
    api.put(kube.CONFIGMAPS, configmap("wp-default"))
    rec = reconciler(api)
    await run_pass(api, rec)
    (old,) = pools(api)
    api.put(kube.CONFIGMAPS, configmap("wp-default", ENV))
    await run_pass(api, rec)
    (new,) = pools(api)
    assert new != old
    assert annotations(api, "wp-default")[labels.PROFILE_GENERATED] == new
    del api.objects[("configmaps", NS, "wp-default")]
    await run_pass(api, rec)
    assert pools(api) == []
    assert api.items(kube.SANDBOX_TEMPLATES) == []


async def test_invalid_toml_is_an_error_and_keeps_the_old_pool_and_others_work(api: FakeApi) -> None:
    api.put(kube.CONFIGMAPS, configmap("wp-default"))
    api.put(kube.CONFIGMAPS, configmap("wp-env", ENV))
    rec = reconciler(api)
    await run_pass(api, rec)
    kept = annotations(api, "wp-env")[labels.PROFILE_GENERATED]
    api.put(kube.CONFIGMAPS, configmap("wp-env", "version = 1\nworkspace = \n"))
    api.put(kube.CONFIGMAPS, configmap("wp-new", DEFAULT.replace("replicas = 2", "replicas = 1") + 'image = "x:1"\n'))
    await run_pass(api, rec)
    status = annotations(api, "wp-env")
    assert status[labels.PROFILE_STATUS] == "Error"
    assert "not valid TOML" in status[labels.PROFILE_LAST_ERROR]
    assert kept in status[labels.PROFILE_LAST_ERROR]
    assert kept in pools(api)
    assert annotations(api, "wp-new")[labels.PROFILE_STATUS] == "Ready"
    assert annotations(api, "wp-default")[labels.PROFILE_STATUS] == "Ready"


async def test_a_rejected_write_is_the_profiles_error_and_its_old_pair_stays(api: FakeApi) -> None:
    api.put(kube.CONFIGMAPS, configmap("wp-default"))
    rec = reconciler(api)
    await run_pass(api, rec)
    (old,) = pools(api)
    api.put(kube.CONFIGMAPS, configmap("wp-default", ENV))
    rec._on_list(api.items(kube.CONFIGMAPS))
    new = profileplan.desire(api.items(kube.CONFIGMAPS)[0], rec._config).generated
    api.rejected.add(new)
    await rec.reconcile_once()
    status = annotations(api, "wp-default")
    assert status[labels.PROFILE_STATUS] == "Error"
    assert "is invalid" in status[labels.PROFILE_LAST_ERROR]
    assert pools(api) == [old]


async def test_our_own_status_write_does_not_wake_the_reconciler(api: FakeApi) -> None:
    api.put(kube.CONFIGMAPS, configmap("wp-default"))
    rec = reconciler(api)
    await run_pass(api, rec)
    rec._wake.clear()
    echo = api.objects[("configmaps", NS, "wp-default")]
    rec._on_event("MODIFIED", copy.deepcopy(echo))
    assert not rec._wake.is_set()
    rec._on_event("MODIFIED", configmap("wp-default", ENV, rv="999"))
    assert rec._wake.is_set()


async def test_missing_extension_apis_end_the_pass_and_turn_the_gate_off(api: FakeApi) -> None:
    api.put(kube.CONFIGMAPS, configmap("wp-default"))
    rec = reconciler(api)
    api.extensions = False
    with pytest.raises(kube.NotFound):
        await run_pass(api, rec)


async def test_lead_waits_for_the_extension_apis_then_reconciles(api: FakeApi) -> None:
    api.put(kube.CONFIGMAPS, configmap("wp-default"))
    api.extensions = False
    clock = FakeClock()
    settings = config(warm_pooling={"profiles": {"enabled": True}})
    gate = ExtensionsGate(api, NS, clock=clock, delays=(1.0,))  # type: ignore[arg-type]
    rec = profiles.ProfileReconciler(api, settings, gate=gate, clock=clock)  # type: ignore[arg-type]
    leading = asyncio.create_task(rec.lead())
    try:
        await clock.advance(5)
        assert rec.passes == 0
        assert pools(api) == []
        api.extensions = True
        await clock.advance(1)
        assert rec.passes == 1
        assert len(pools(api)) == 1
        # The APIs vanish: the pass fails with 404, the gate turns off and lead() returns so the
        # elector starts it over (waiting for the APIs again).
        api.extensions = False
        rec._wake.set()
        await settle()
        assert leading.done()
        assert gate.available is False
    finally:
        leading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leading


# -- the gate ----------------------------------------------------------------------------------------------


async def test_gate_warns_once_while_absent_and_turns_on_when_they_appear(
    api: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    gate = ExtensionsGate(api, NS, clock=clock, delays=(1.0, 2.0, 5.0))  # type: ignore[arg-type]
    api.extensions = False
    caplog.set_level(logging.INFO, logger="warmshell.drivers.kubernetes.warm.extensions")
    waiter = asyncio.create_task(gate.wait_available())
    await clock.advance(60)
    assert gate.available is False
    assert not waiter.done()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "warm pooling is off" in warnings[0].getMessage()
    api.extensions = True
    await clock.advance(5)
    await settle()
    assert waiter.done()
    assert gate.available is True
    assert any("warm pooling is on" in r.getMessage() for r in caplog.records)
    gate.lost()
    gate.lost()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2  # one per transition
