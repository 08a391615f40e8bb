"""Deleting a claim as the informer last showed it: under its uid, and False (so the driver looks
it up with a LIST) when there is none cached, or it went or was replaced since."""

from __future__ import annotations

from typing import Any

import pytest

from warmshell.drivers.kubernetes import finding, kube

CLAIM = {"metadata": {"namespace": "ns", "name": "one", "uid": "u-1"}}


class Api:
    def __init__(self, answer: Exception | None = None) -> None:
        self.answer = answer
        self.deletes: list[tuple[str, str, str]] = []

    async def delete(self, resource: kube.Resource, namespace: str, name: str, *, uid: str = "") -> Any:
        self.deletes.append((namespace, name, uid))
        if self.answer is not None:
            raise self.answer
        return {}


async def test_a_cached_claim_is_deleted_under_its_uid() -> None:
    api = Api()
    assert await finding.delete_cached(api, kube.SANDBOX_CLAIMS, CLAIM)  # type: ignore[arg-type]
    assert api.deletes == [("ns", "one", "u-1")]


@pytest.mark.parametrize(
    "answer", [kube.NotFound(404, "NotFound", "gone"), kube.Conflict(409, "Conflict", "uid precondition failed")]
)
async def test_a_claim_gone_or_replaced_since_is_left_to_the_lookup(answer: Exception) -> None:
    api = Api(answer)
    assert not await finding.delete_cached(api, kube.SANDBOX_CLAIMS, CLAIM)  # type: ignore[arg-type]
    assert api.deletes == [("ns", "one", "u-1")]


async def test_nothing_cached_sends_nothing() -> None:
    api = Api()
    assert not await finding.delete_cached(api, kube.SANDBOX_CLAIMS, None)  # type: ignore[arg-type]
    assert api.deletes == []
