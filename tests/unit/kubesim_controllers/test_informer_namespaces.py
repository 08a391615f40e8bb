"""An informer's objects of one namespace are its cache's objects in that namespace, in the
cache's order, through any sequence of events."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kubesim.controllers import client as kc
from kubesim.controllers.informer import Informer

NAMESPACES = ("", "a", "b")
EVENTS = st.lists(
    st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.sampled_from(NAMESPACES), st.sampled_from("xyz")),
    max_size=40,
)


def _obj(namespace: str, name: str, rv: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "resourceVersion": str(rv)}
    if namespace:
        metadata["namespace"] = namespace
    return {"metadata": metadata}


@given(EVENTS)
def test_items_of_a_namespace_follow_the_cache(events: list[tuple[str, str, str]]) -> None:
    informer = Informer(None, kc.PODS, watch_timeout=1)  # type: ignore[arg-type]  # no API: no list or watch here
    for rv, (etype, namespace, name) in enumerate(events, start=1):
        informer._apply(etype, _obj(namespace, name, rv))
        for ns in NAMESPACES:
            expected = [obj for (key_ns, _), obj in informer.cache.items() if key_ns == ns]
            assert informer.items(ns) == expected
        assert informer.items() == list(informer.cache.values())
