import pathlib

import pytest

from kubesim.kubelet import volumes

POD = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"app": "x"},
        "annotations": {"note": "n"},
    },
    "spec": {"nodeName": "node-0"},
    "status": {"podIP": "127.1.0.2", "podIPs": [{"ip": "127.1.0.2"}], "hostIP": "127.0.0.1"},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "p"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "u-1"),
        ("status.podIP", "127.1.0.2"),
        ("spec.nodeName", "node-0"),
        ("spec.serviceAccountName", "default"),
        ("metadata.labels['app']", "x"),
        ("metadata.annotations['note']", "n"),
    ],
)
def test_downward_api_fields(path: str, value: str) -> None:
    assert volumes.field_value(POD, path) == value


def test_unknown_field_is_an_error() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        volumes.field_value(POD, "spec.bogus")


def test_dependent_variable_expansion() -> None:
    env = {"A": "1"}
    assert volumes.expand("$(A)-$(B)-$$(A)", env) == "1-$(B)-$(A)"


async def test_container_env_resolves_values_and_field_refs() -> None:
    container = {
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "GREETING", "value": "hi $(NAME)"},
        ]
    }
    env = await volumes.container_env(None, POD, container, {"PATH": "/bin"})  # type: ignore[arg-type]
    assert env == {"PATH": "/bin", "NAME": "p", "GREETING": "hi p"}


def test_mount_paths_map_under_the_pod_root(tmp_path: pathlib.Path) -> None:
    vol = tmp_path / ".volumes" / "tok"
    vol.mkdir(parents=True)
    (vol / "token").write_text("secret")
    container = {"volumeMounts": [{"name": "tok", "mountPath": "/var/run/secrets/tokens"}]}
    volumes.mount(tmp_path, container, {"tok": vol})
    assert (tmp_path / "var/run/secrets/tokens/token").read_text() == "secret"
    assert volumes.host_path(tmp_path, "/a/b") == tmp_path / "a" / "b"
