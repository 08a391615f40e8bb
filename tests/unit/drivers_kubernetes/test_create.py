"""Settling an ambiguous create by reading back, with a scripted API (kubesim cannot lose a
response after committing the object; this fake can)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from warmshell.core.config import StatePaths
from warmshell.core.errors import AlreadyExistsError, UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxSpec
from warmshell.drivers.base import CreateRequest
from warmshell.drivers.kubernetes import KubernetesDriver, kube

from .fakes import config

Obj = dict[str, Any]
LOST = kube.Temporary(0, "Timeout", "no answer")
REQUEST = CreateRequest(
    sandbox_id=SandboxId("sbx-1"), name="one", workspace="default", spec=SandboxSpec(), activation_proof="p"
)


class ScriptedApi:
    """Creates and reads follow scripts: an exception is raised, "store" commits the body."""

    def __init__(self, creates: list[Any], reads: list[Any]) -> None:
        self.creates, self.reads = creates, reads
        self.stored: Obj | None = None
        self.calls: list[str] = []

    async def sandbox_resource(self, namespace: str) -> kube.Resource:
        return kube.sandboxes("v1beta1")

    async def list(self, resource: kube.Resource, namespace: str, **_: Any) -> Obj:
        return {"metadata": {"resourceVersion": "1"}, "items": []}  # what the informers list first

    async def watch(self, resource: kube.Resource, namespace: str, **_: Any) -> AsyncGenerator[Obj, None]:
        await asyncio.Event().wait()  # nothing happens on the informers' watches
        yield {}

    async def create(self, resource: kube.Resource, namespace: str, body: Obj) -> Obj:
        self.calls.append("create")
        step = self.creates.pop(0)
        if step in ("store", "store-then-lose"):
            self.stored = body
        if step == "store":
            return body
        raise LOST if step == "store-then-lose" else step

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> Obj:
        self.calls.append("get")
        step = self.reads.pop(0) if self.reads else "stored"
        if step != "stored":
            raise step
        if self.stored is None:
            raise kube.NotFound(404, "NotFound", name)
        return self.stored


async def create(api: ScriptedApi, tmp_path: Path) -> Any:
    # Cold creates only: warm pooling would probe and watch the extension APIs.
    cold = config(warm_pooling={"enabled": False})
    driver = KubernetesDriver(cold, StatePaths(tmp_path), api=api)  # type: ignore[arg-type]
    async with driver:
        return await driver.create(REQUEST)


async def test_a_create_whose_answer_was_lost_is_found_by_reading_back(tmp_path: Path) -> None:
    api = ScriptedApi(creates=["store-then-lose"], reads=[])
    view = await create(api, tmp_path)
    assert view.sandbox_id == "sbx-1"
    assert api.calls == ["create", "get"]  # never a second write


async def test_a_failed_create_proven_absent_is_tried_again(tmp_path: Path) -> None:
    api = ScriptedApi(creates=[LOST, "store"], reads=[])
    await create(api, tmp_path)
    assert api.calls == ["create", "get", "create"]


async def test_an_outcome_that_stays_unknown_is_unavailable(tmp_path: Path) -> None:
    api = ScriptedApi(creates=[LOST], reads=[LOST])
    with pytest.raises(UnavailableError, match="outcome unknown"):
        await create(api, tmp_path)
    assert api.calls == ["create", "get"]


async def test_repeated_failures_give_up_after_the_attempts(tmp_path: Path) -> None:
    api = ScriptedApi(creates=[LOST, LOST, LOST], reads=[])
    with pytest.raises(UnavailableError, match="after 3 attempts"):
        await create(api, tmp_path)
    assert api.calls == ["create", "get"] * 3


async def test_an_existing_object_of_another_sandbox_is_refused(tmp_path: Path) -> None:
    api = ScriptedApi(creates=[kube.AlreadyExists(409, "AlreadyExists", "exists")], reads=[])
    api.stored = {"metadata": {"labels": {"warmshell.dev/managed-by": "warmshell", "warmshell.dev/sandbox-id": "x"}}}
    with pytest.raises(AlreadyExistsError, match="belongs to another sandbox"):
        await create(api, tmp_path)


async def test_a_permanent_rejection_is_not_retried(tmp_path: Path) -> None:
    api = ScriptedApi(creates=[kube.Rejected(422, "Invalid", "spec.podTemplate: Required value")], reads=[])
    with pytest.raises(kube.Rejected):
        await create(api, tmp_path)
    assert api.calls == ["create"]
