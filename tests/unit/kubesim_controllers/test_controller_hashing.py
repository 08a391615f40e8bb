from kubesim.controllers import labels
from kubesim.controllers.hashing import fnv1a_32, json_hash, name_hash


def test_name_hash_matches_upstream_vectors() -> None:
    assert name_hash("sandbox") == "da1fd924"
    assert name_hash("my-warm-pool") == "034dafb4"
    assert name_hash("test-template") == "69155462"


def test_fnv_of_empty_input_is_the_offset_basis() -> None:
    assert fnv1a_32(b"") == 0x811C9DC5
    assert name_hash("") == "811c9dc5"


def test_json_hash_ignores_key_order_but_not_values() -> None:
    assert json_hash({"a": 1, "b": [1, 2]}) == json_hash({"b": [1, 2], "a": 1})
    assert json_hash({"a": 1}) != json_hash({"a": 2})
    assert len(json_hash({})) == 8


def test_system_keys_and_created_by_normalisation() -> None:
    assert labels.is_system_key("agents.x-k8s.io/claim-uid")
    assert labels.is_system_key("extensions.agents.x-k8s.io/x")
    assert not labels.is_system_key("app")
    assert labels.is_system_annotation("opentelemetry.io/trace-context")
    assert labels.normalize_created_by("python-client") == "python-client"
    assert labels.normalize_created_by("kubectl") == "unknown"
