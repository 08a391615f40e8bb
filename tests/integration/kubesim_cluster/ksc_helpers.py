"""Helpers for the kubesim cluster tests: objects to apply, and waiting on conditions with deadlines.

Objects are read back over HTTP (GET/LIST), the way warmshell and kubectl see them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kubesim.controllers import client as kc

Obj = dict[str, Any]
T = TypeVar("T")

NS = "default"


def template(name: str = "tmpl", *, command: list[str] | None = None, **spec: Any) -> Obj:
    container: Obj = {
        "name": "main",
        "image": "busybox:1.36",
        "command": command or ["sleep", "3600"],
    }
    body: Obj = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
            },
            **spec,
        },
    }
    return body


def pool(name: str = "pool", *, replicas: int = 2, template_name: str = "tmpl", **spec: Any) -> Obj:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template_name}, **spec},
    }


def claim(name: str, *, pool_name: str = "pool", **spec: Any) -> Obj:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name, "labels": {"agents.x-k8s.io/created-by": "python-client"}},
        "spec": {"warmPoolRef": {"name": pool_name}, **spec},
    }


def sandbox(name: str, *, command: list[str] | None = None, **spec: Any) -> Obj:
    tmpl = template(command=command)["spec"]
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": tmpl["podTemplate"], **spec},
    }


def condition(obj: Obj | None, ctype: str = "Ready") -> Obj:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return {}


def is_ready(obj: Obj | None) -> bool:
    return condition(obj).get("status") == "True"


async def wait_for(
    probe: Callable[[], Awaitable[T]],
    predicate: Callable[[T], bool],
    *,
    within: float = 20.0,
    what: str = "condition",
) -> T:
    """Re-read with ``probe`` until ``predicate`` holds; fail with the last value at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await probe()
        if predicate(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {value!r}")
        await asyncio.sleep(0.02)


async def get_or_none(api: kc.KubeClient, res: kc.Resource, name: str, ns: str = NS) -> Obj | None:
    try:
        return await api.get(res, ns, name)
    except kc.ApiError as exc:
        if exc.not_found:
            return None
        raise


async def items(api: kc.KubeClient, res: kc.Resource, *, label_selector: str | None = None) -> list[Obj]:
    listed = await api.list_objects(res, NS, label_selector=label_selector)
    return list(listed.get("items") or [])


async def wait_ready(api: kc.KubeClient, res: kc.Resource, name: str, *, within: float = 20.0) -> Obj:
    obj = await wait_for(
        lambda: get_or_none(api, res, name), is_ready, within=within, what=f"{res.plural}/{name} Ready"
    )
    assert obj is not None
    return obj


async def wait_gone(api: kc.KubeClient, res: kc.Resource, name: str, *, within: float = 20.0) -> None:
    await wait_for(lambda: get_or_none(api, res, name), lambda o: o is None, within=within, what=f"{name} gone")


async def pool_members(api: kc.KubeClient, pool_name: str = "pool") -> list[Obj]:
    from kubesim.controllers.hashing import name_hash

    members = await items(api, kc.SANDBOXES, label_selector=f"agents.x-k8s.io/warm-pool-sandbox={name_hash(pool_name)}")
    return [m for m in members if not m["metadata"].get("deletionTimestamp")]


async def wait_pool_ready(api: kc.KubeClient, pool_name: str, replicas: int, *, within: float = 30.0) -> Obj:
    def full(p: Obj | None) -> bool:
        status = (p or {}).get("status") or {}
        return status.get("readyReplicas") == replicas and status.get("replicas") == replicas

    obj = await wait_for(
        lambda: get_or_none(api, kc.POOLS, pool_name), full, within=within, what=f"pool {pool_name} full"
    )
    assert obj is not None
    return obj
