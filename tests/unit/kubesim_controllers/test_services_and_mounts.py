"""Pure parts of Services and pod filesystems: the EndpointSlice a Service gets, the pod's hosts
file, the directories a mount namespace overlays, the ServiceAccount volume, image programs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubesim.apiserver import serviceaccounts
from kubesim.controllers.endpointslices import desired_slice
from kubesim.kubelet import images, mountns, volumes


def _pod(name: str, *, ip: str | None, ready: bool, labels: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels or {"app": "x"}},
        "spec": {"nodeName": "n0", "containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 8080}]}]},
        "status": status,
    }


def test_slice_lists_selected_pods_with_ips_and_their_readiness() -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc", "namespace": "ns", "uid": "svc-uid"},
        "spec": {"selector": {"app": "x"}, "ports": [{"name": "http", "port": 80, "targetPort": "web"}]},
    }
    pods = [
        _pod("b", ip="127.1.0.3", ready=False),
        _pod("a", ip="127.1.0.2", ready=True),
        _pod("pending", ip=None, ready=False),
        _pod("other", ip="127.1.0.4", ready=True, labels={"app": "y"}),
    ]
    eps = desired_slice(service, pods)
    assert [(e["targetRef"]["name"], e["conditions"]["ready"]) for e in eps["endpoints"]] == [("a", True), ("b", False)]
    assert eps["ports"] == [{"name": "http", "protocol": "TCP", "port": 8080}]
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == "svc"
    assert eps["metadata"]["ownerReferences"][0]["uid"] == "svc-uid"


def test_hosts_file_names_services_in_the_cluster_domain() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"hostAliases": [{"ip": "127.0.0.9", "hostnames": ["db"]}]},
    }
    services = [
        {"metadata": {"name": "gw", "namespace": "ns"}, "spec": {"clusterIP": "127.42.0.5"}},
        {"metadata": {"name": "api", "namespace": "other"}, "spec": {"clusterIP": "127.42.0.6"}},
        {"metadata": {"name": "headless", "namespace": "ns"}, "spec": {"clusterIP": "None"}},
    ]
    lines = volumes.hosts_file(pod, "127.1.0.2", services).splitlines()
    assert "127.1.0.2\tp" in lines
    assert "127.0.0.9\tdb" in lines
    assert "127.42.0.5\tgw.ns.svc.cluster.local gw.ns.svc gw.ns gw" in lines
    assert "127.42.0.6\tapi.other.svc.cluster.local api.other.svc api.other" in lines
    assert not any("headless" in line for line in lines)


def test_overlay_roots_are_the_nearest_existing_parents(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "var" / "lib").mkdir(parents=True)
    targets = [
        tmp_path / "etc" / "app",
        tmp_path / "etc" / "app" / "keys",
        tmp_path / "var" / "lib" / "app",
        tmp_path / "etc",  # exists: bound directly
    ]
    assert sorted(mountns.overlay_roots(targets)) == sorted([tmp_path / "etc", tmp_path / "var" / "lib"])
    # A parent that covers another replaces it.
    assert mountns.overlay_roots([tmp_path / "etc" / "a", tmp_path / "new" / "b"]) == [tmp_path]


def test_service_account_volume_unless_opted_out() -> None:
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "c"}], "initContainers": [{"name": "i"}]}}
    serviceaccounts.mount_token(pod, None)
    (volume,) = pod["spec"]["volumes"]
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert sources[1]["configMap"]["name"] == "kube-root-ca.crt"
    assert sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.namespace"
    for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        assert c["volumeMounts"] == [
            {"name": volume["name"], "readOnly": True, "mountPath": serviceaccounts.MOUNT_PATH}
        ]
    opted_out: dict[str, Any] = {"spec": {"containers": [{"name": "c"}]}}
    serviceaccounts.mount_token(opted_out, {"automountServiceAccountToken": False})
    assert "volumes" not in opted_out["spec"]
    # The pod's own setting wins over its ServiceAccount's.
    opted_in: dict[str, Any] = {"spec": {"automountServiceAccountToken": True, "containers": [{"name": "c"}]}}
    serviceaccounts.mount_token(opted_in, {"automountServiceAccountToken": False})
    assert len(opted_in["spec"]["volumes"]) == 1


def test_the_warmshell_image_runs_its_own_program() -> None:
    rules = images.ImageMap()
    container = {
        "image": "ghcr.io/warmshell/warmshell:0.1.0",
        "command": ["warmshell", "gateway", "start"],
        "args": ["-v"],
    }
    argv = rules.argv(container)
    assert argv[1:] == ["-m", "warmshell", "gateway", "start", "-v"]
    assert rules.argv({"image": "ghcr.io/warmshell/warmshell:0.1.0"})[1:] == ["-m", "warmshell", "supervisor"]
    assert rules.argv({"image": "busybox", "command": ["warmshell"]}) == ["warmshell"]
