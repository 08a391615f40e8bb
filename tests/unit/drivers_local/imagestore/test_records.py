"""The index's JSON form: a layer's `by_content` survives a round trip, and is written only when
False, so a store with no untagged snapshot keeps the form older gateways read."""

from __future__ import annotations

from warmshell.drivers.local.imagestore.records import Index, LayerRecord


def test_layers_round_trip_and_only_an_untagged_snapshots_says_so() -> None:
    named = LayerRecord("sha256:" + "a" * 64, 2048, entries=3, files=1, whiteouts=("etc/x",), opaque=("opt",))
    random = LayerRecord("sha256:" + "b" * 64, 1024, by_content=False)
    index = Index(layers={named.digest: named, random.digest: random})
    data = index.to_json()
    assert "by_content" not in data["layers"][named.digest]
    assert data["layers"][random.digest]["by_content"] is False
    assert Index.from_json(data).layers == index.layers
