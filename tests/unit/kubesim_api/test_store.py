"""The store: resourceVersions, the event window and 410."""

from __future__ import annotations

from typing import Any

from kubesim.apiserver.store import Store


def put(store: Store, name: str, old: Any = None) -> Any:
    rv = store.next_rv()
    obj = {"metadata": {"name": name, "namespace": "d", "uid": f"uid-{name}", "resourceVersion": str(rv)}}
    return store.put("", "configmaps", obj, old)


def test_resource_versions_increase_across_resources() -> None:
    store = Store()
    a = put(store, "a")
    rv = store.next_rv()
    store.put(
        "", "secrets", {"metadata": {"name": "s", "namespace": "d", "uid": "s", "resourceVersion": str(rv)}}, None
    )
    b = put(store, "b")
    assert a.rv < rv < b.rv


def test_replay_window_and_expiry() -> None:
    store = Store(window=3)
    start = store.rv
    stored = [put(store, f"o{i}") for i in range(3)]
    events = store.replay("", "configmaps", start)
    assert events is not None
    assert [e.new.obj["metadata"]["name"] for e in events] == ["o0", "o1", "o2"]
    put(store, "o3")  # pushes o0 out of the window
    assert store.replay("", "configmaps", start) is None
    tail = store.replay("", "configmaps", stored[0].rv)
    assert tail is not None
    assert [e.new.obj["metadata"]["name"] for e in tail] == ["o1", "o2", "o3"]
    store.compact()
    assert store.replay("", "configmaps", stored[2].rv) is None
    assert store.replay("", "configmaps", store.rv) == []


def test_delete_event_carries_a_new_resource_version() -> None:
    store = Store()
    obj = put(store, "x")
    gone = store.delete("", "configmaps", obj)
    assert gone.rv > obj.rv
    assert store.get("", "configmaps", "d", "x") is None
    assert store.resolve_uid("uid-x") is None


def test_encoding_is_cached_and_rewrites_api_version() -> None:
    store = Store()
    rv = store.next_rv()
    s = store.put(
        "g", "things", {"apiVersion": "g/v2", "metadata": {"name": "n", "uid": "u", "resourceVersion": str(rv)}}, None
    )
    assert s.encoded() is s.encoded()
    assert b'"apiVersion":"g/v1"' in s.encoded("g/v1")


def test_snapshot_rebuilds_an_earlier_state() -> None:
    store = Store(window=10)
    a = put(store, "a")
    b = put(store, "b")
    before = store.rv
    put(store, "a", old=a)  # modified
    store.delete("", "configmaps", b)
    put(store, "c")
    then = store.snapshot("", "configmaps", before)
    assert then is not None
    assert {k: v.rv for k, v in then.items()} == {("d", "a"): a.rv, ("d", "b"): b.rv}
    now = store.snapshot("", "configmaps", store.rv)
    assert now is not None
    assert sorted(k[1] for k in now) == ["a", "c"]
    store.compact()
    assert store.snapshot("", "configmaps", before) is None


def test_copy_is_a_private_deep_copy_at_the_asked_version() -> None:
    store = Store()
    stored = put(store, "a")
    stored.obj["spec"] = {"items": [{"x": 1}]}
    copied = stored.copy("example.com/v2")
    assert copied == {**stored.obj, "apiVersion": "example.com/v2"}
    copied["spec"]["items"][0]["x"] = 2
    assert stored.obj["spec"]["items"][0]["x"] == 1  # nothing shared with the stored object
