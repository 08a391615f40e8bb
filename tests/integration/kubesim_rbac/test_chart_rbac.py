"""kubesim enforcing exactly the chart's RBAC on the gateway's ServiceAccount token.

For every combination of the two warm-pooling toggles: render the chart with the real helm, apply
its ServiceAccounts, Roles, ClusterRoles, bindings and Lease to an RBAC-enabled kubesim (as the
admin), get a token for the gateway's ServiceAccount through TokenRequest, and check with
kubernetes_asyncio (and once with the real kubectl) what that token may and may not do.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from kubesim.apiserver import ApiServer, ServerConfig
from kubesim.apiserver.rest import WriteOptions
from kubesim.controllers import crds_install
from kubesim.testing import running_apiserver
from tests.integration.kubesim_api.conftest import Kubectl, kubectl_binary
from tests.unit.chart.rendering import RELEASE_NAMESPACE, TOGGLES, render

SANDBOX_NS = "sandboxes"
ELSEWHERE = "elsewhere"
AGENTS = ("agents.x-k8s.io", "v1beta1")
EXTENSIONS = ("extensions.agents.x-k8s.io", "v1beta1")
APPLIED_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Lease")
POD_SPEC = {"containers": [{"name": "main", "image": "busybox:1.36"}]}


def chart_values(warm: bool, profiles: bool) -> dict[str, object]:
    return {"warmPooling.enabled": warm, "warmPooling.profiles.enabled": profiles, "sandbox.namespace": SANDBOX_NS}


async def status_of(call: Awaitable[Any]) -> int:
    """The HTTP status a client call ended with (2xx when it returned)."""
    try:
        await call
    except ApiException as exc:
        return int(exc.status)
    return 200


def allowed(flag: bool) -> int:
    return 200 if flag else 403


@dataclass
class Env:
    """An RBAC-enabled server with the chart applied, and clients for the admin and the gateway."""

    server: ApiServer
    admin: client.ApiClient
    gateway: client.ApiClient
    gateway_user: str
    gateway_token: str
    gateway_kubeconfig: Path
    lease_name: str


def _kubeconfig(server: ApiServer, path: Path, token: str | None = None) -> Path:
    data = server.kubeconfig(admin=token is None)
    if token is not None:
        data["users"][0]["user"]["token"] = token
    path.write_text(yaml.safe_dump(data))
    return path


async def _client(path: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    return client.ApiClient(configuration)


async def _apply(admin: client.ApiClient, obj: dict[str, Any]) -> None:
    """Create one rendered object with the typed API for its kind, as an operator's tool would."""
    ns = obj["metadata"].get("namespace", "")
    rbac = client.RbacAuthorizationV1Api(admin)
    creators: dict[str, Callable[[], Awaitable[Any]]] = {
        "ServiceAccount": lambda: client.CoreV1Api(admin).create_namespaced_service_account(ns, obj),
        "Role": lambda: rbac.create_namespaced_role(ns, obj),
        "RoleBinding": lambda: rbac.create_namespaced_role_binding(ns, obj),
        "ClusterRole": lambda: rbac.create_cluster_role(obj),
        "ClusterRoleBinding": lambda: rbac.create_cluster_role_binding(obj),
        "Lease": lambda: client.CoordinationV1Api(admin).create_namespaced_lease(ns, obj),
    }
    await creators[obj["kind"]]()


@contextlib.asynccontextmanager
async def chart_env(tmp_path: Path, warm: bool, profiles: bool) -> AsyncIterator[Env]:
    manifests = render(chart_values(warm, profiles))
    async with running_apiserver(ServerConfig(rbac=True)) as server:
        # Test setup goes in process: namespaces and the agent-sandbox CRDs are cluster furniture.
        ns_type = server.registry.get("", "namespaces")
        crd_type = server.registry.get("apiextensions.k8s.io", "customresourcedefinitions")
        assert ns_type is not None
        assert crd_type is not None
        for name in (SANDBOX_NS, RELEASE_NAMESPACE, ELSEWHERE):
            server.rest.create(ns_type, "v1", "", {"metadata": {"name": name}}, WriteOptions())
        for crd in crds_install.manifests():
            server.rest.create(crd_type, "v1", "", crd, WriteOptions())
        admin = await _client(_kubeconfig(server, tmp_path / "admin.yaml"))
        gateway: client.ApiClient | None = None
        try:
            # The chart itself goes over HTTP with a real client, exercising the served RBAC kinds.
            for kind in APPLIED_KINDS:
                for obj in manifests.of_kind(kind):
                    await _apply(admin, obj)
            subject = manifests.of_kind("ClusterRoleBinding")[0]["subjects"][0]
            assert subject["kind"] == "ServiceAccount"
            assert subject["namespace"] == RELEASE_NAMESPACE
            token = await client.CoreV1Api(admin).create_namespaced_service_account_token(
                subject["name"], RELEASE_NAMESPACE, {"spec": {"expirationSeconds": 3600}}
            )
            kubeconfig = _kubeconfig(server, tmp_path / "gateway.yaml", token.status.token)
            gateway = await _client(kubeconfig)
            yield Env(
                server,
                admin,
                gateway,
                f"system:serviceaccount:{RELEASE_NAMESPACE}:{subject['name']}",
                token.status.token,
                kubeconfig,
                manifests.one("Lease")["metadata"]["name"],
            )
        finally:
            if gateway is not None:
                await gateway.close()
            await admin.close()


def _sandbox(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(AGENTS),
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": POD_SPEC}},
    }


def _extension(kind: str, name: str) -> dict[str, Any]:
    specs: dict[str, dict[str, Any]] = {
        "SandboxClaim": {"warmPoolRef": {"name": "pool"}},
        "SandboxTemplate": {"podTemplate": {"spec": POD_SPEC}},
        "SandboxWarmPool": {"replicas": 1, "sandboxTemplateRef": {"name": "tmpl"}},
    }
    return {"apiVersion": "/".join(EXTENSIONS), "kind": kind, "metadata": {"name": name}, "spec": specs[kind]}


async def _first_watch_event(api: client.CustomObjectsApi, ns: str) -> dict[str, Any]:
    """The first event of a watch on sandboxes (an ADDED for each existing object comes first)."""
    async with watch.Watch() as w:
        async for event in w.stream(api.list_namespaced_custom_object, *AGENTS, ns, "sandboxes", timeout_seconds=10):
            return dict(event)
    raise AssertionError("the watch ended without an event")


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
async def test_gateway_token_gets_exactly_the_charts_permissions(tmp_path: Path, warm: bool, profiles: bool) -> None:
    reconciler = warm and profiles  # the chart grants profile permissions only with warm pooling on
    async with chart_env(tmp_path, warm, profiles) as env:
        custom = client.CustomObjectsApi(env.gateway)
        core = client.CoreV1Api(env.gateway)

        # Sandboxes: full lifecycle in the sandbox namespace, nothing anywhere else.
        created = await custom.create_namespaced_custom_object(*AGENTS, SANDBOX_NS, "sandboxes", _sandbox("sb"))
        assert created["metadata"]["name"] == "sb"
        await custom.get_namespaced_custom_object(*AGENTS, SANDBOX_NS, "sandboxes", "sb")
        listed = await custom.list_namespaced_custom_object(*AGENTS, SANDBOX_NS, "sandboxes")
        assert [s["metadata"]["name"] for s in listed["items"]] == ["sb"]
        event = await _first_watch_event(custom, SANDBOX_NS)
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "sb")
        await custom.delete_namespaced_custom_object(*AGENTS, SANDBOX_NS, "sandboxes", "sb")
        for ns in (ELSEWHERE, RELEASE_NAMESPACE):
            assert (
                await status_of(custom.create_namespaced_custom_object(*AGENTS, ns, "sandboxes", _sandbox("x"))) == 403
            )
            assert await status_of(custom.list_namespaced_custom_object(*AGENTS, ns, "sandboxes")) == 403
            assert await status_of(_first_watch_event(custom, ns)) == 403
        assert await status_of(custom.list_cluster_custom_object(*AGENTS, "sandboxes")) == 403

        # Pods: read, never write.
        admin_core = client.CoreV1Api(env.admin)
        await admin_core.create_namespaced_pod(SANDBOX_NS, {"metadata": {"name": "p1"}, "spec": POD_SPEC})
        pod = await core.read_namespaced_pod("p1", SANDBOX_NS)
        assert pod.metadata.name == "p1"
        with pytest.raises(ApiException) as denied:
            await core.patch_namespaced_pod("p1", SANDBOX_NS, {"metadata": {"labels": {"sandbox": "forged"}}})
        assert denied.value.status == 403
        body = yaml.safe_load(denied.value.body)
        assert body["reason"] == "Forbidden"
        assert body["message"] == (
            f'pods "p1" is forbidden: User "{env.gateway_user}" cannot patch resource "pods" in API group "" '
            f'in the namespace "{SANDBOX_NS}"'
        )
        assert body["details"] == {"name": "p1", "kind": "pods"}
        assert await status_of(core.patch_namespaced_pod_status("p1", SANDBOX_NS, {"status": {}})) == 403
        assert await status_of(core.read_namespaced_pod("p1", ELSEWHERE)) == 403
        assert await status_of(core.list_namespaced_secret(SANDBOX_NS)) == 403

        # TokenReview: the gateway checks supervisors' projected tokens.
        review = await client.AuthenticationV1Api(env.gateway).create_token_review(
            {"spec": {"token": env.gateway_token}}
        )
        assert review.status.authenticated
        assert review.status.user.username == env.gateway_user

        # Claims iff warm pooling; template/pool writes and ConfigMap reads iff the profile reconciler.
        claim = _extension("SandboxClaim", "c1")
        status = await status_of(
            custom.create_namespaced_custom_object(*EXTENSIONS, SANDBOX_NS, "sandboxclaims", claim)
        )
        assert status == allowed(warm)
        assert await status_of(custom.list_namespaced_custom_object(*EXTENSIONS, SANDBOX_NS, "sandboxwarmpools")) == (
            allowed(warm)
        )
        for plural, kind in (("sandboxtemplates", "SandboxTemplate"), ("sandboxwarmpools", "SandboxWarmPool")):
            body = _extension(kind, "gen")
            status = await status_of(custom.create_namespaced_custom_object(*EXTENSIONS, SANDBOX_NS, plural, body))
            assert status == allowed(reconciler), plural
            body = _extension(kind, "gen2")
            assert await status_of(custom.create_namespaced_custom_object(*EXTENSIONS, ELSEWHERE, plural, body)) == 403
        assert await status_of(core.list_namespaced_config_map(SANDBOX_NS)) == allowed(reconciler)
        assert await status_of(core.list_namespaced_config_map(ELSEWHERE)) == 403

        # Leader election: get/update on its own Lease only; create only for the reconciler.
        leases = client.CoordinationV1Api(env.gateway)
        admin_leases = client.CoordinationV1Api(env.admin)
        lease = await leases.read_namespaced_lease(env.lease_name, RELEASE_NAMESPACE)
        lease.spec.holder_identity = "gateway-0"
        replaced = await leases.replace_namespaced_lease(env.lease_name, RELEASE_NAMESPACE, lease)
        assert replaced.spec.holder_identity == "gateway-0"
        other = {"metadata": {"name": "someone-else"}, "spec": {}}
        await admin_leases.create_namespaced_lease(RELEASE_NAMESPACE, other)
        theirs = await admin_leases.read_namespaced_lease("someone-else", RELEASE_NAMESPACE)
        theirs.spec.holder_identity = "gateway-0"
        assert await status_of(leases.replace_namespaced_lease("someone-else", RELEASE_NAMESPACE, theirs)) == 403
        assert await status_of(leases.read_namespaced_lease("someone-else", RELEASE_NAMESPACE)) == 403
        fresh = {"metadata": {"name": "fresh"}, "spec": {}}
        assert await status_of(leases.create_namespaced_lease(RELEASE_NAMESPACE, fresh)) == allowed(reconciler)
        assert await status_of(leases.list_namespaced_lease(RELEASE_NAMESPACE)) == 403


async def _access(env: Env, ra: dict[str, str]) -> Any:
    spec = {"user": env.gateway_user, "groups": ["system:serviceaccounts"], "resourceAttributes": ra}
    return await client.AuthorizationV1Api(env.admin).create_subject_access_review({"spec": spec})


async def test_access_reviews_answer_with_the_same_rules(tmp_path: Path) -> None:
    async with chart_env(tmp_path, warm=True, profiles=False) as env:
        pods = {"namespace": SANDBOX_NS, "resource": "pods", "verb": "get"}
        review = await _access(env, pods)
        assert review.status.allowed
        assert review.status.reason == (
            f'RBAC: allowed by RoleBinding "ws-warmshell-sandboxes/{SANDBOX_NS}" of Role "ws-warmshell-sandboxes" '
            f'to ServiceAccount "ws-warmshell/{RELEASE_NAMESPACE}"'
        )
        assert not (await _access(env, {**pods, "verb": "patch"})).status.allowed
        assert not (await _access(env, {**pods, "namespace": ELSEWHERE})).status.allowed
        lease = {"namespace": RELEASE_NAMESPACE, "group": "coordination.k8s.io", "resource": "leases", "verb": "update"}
        assert (await _access(env, {**lease, "name": env.lease_name})).status.allowed
        assert not (await _access(env, {**lease, "name": "other"})).status.allowed
        # The token itself may ask about itself (system:basic-user), and gets the same answer.
        ssar = {"spec": {"resourceAttributes": {**pods, "verb": "patch"}}}
        mine = await client.AuthorizationV1Api(env.gateway).create_self_subject_access_review(ssar)
        assert mine.status.allowed is False
        # ...but not about others: SubjectAccessReview needs its own grant.
        sar = {"spec": {"user": "alice", "resourceAttributes": pods}}
        assert await status_of(client.AuthorizationV1Api(env.gateway).create_subject_access_review(sar)) == 403


async def test_kubectl_sees_the_same_decisions(tmp_path: Path) -> None:
    async with chart_env(tmp_path, warm=True, profiles=False) as env:
        admin_core = client.CoreV1Api(env.admin)
        await admin_core.create_namespaced_pod(SANDBOX_NS, {"metadata": {"name": "p1"}, "spec": POD_SPEC})
        binary, cache = kubectl_binary(), tmp_path / "kubectl-cache"
        as_gateway = Kubectl(binary, env.gateway_kubeconfig, cache)
        code, out, _ = await as_gateway.run("auth", "can-i", "get", "pods", "-n", SANDBOX_NS, check=False)
        assert (code, out.strip()) == (0, "yes")
        code, out, _ = await as_gateway.run("auth", "can-i", "patch", "pods", "-n", SANDBOX_NS, check=False)
        assert (code, out.strip()) == (1, "no")
        code, out, _ = await as_gateway.run("auth", "can-i", "--list", "-n", SANDBOX_NS)
        listed = {line.split()[0] for line in out.splitlines()[1:] if line.strip()}
        assert {"sandboxes.agents.x-k8s.io", "pods", "tokenreviews.authentication.k8s.io"} <= listed
        assert "configmaps" not in listed
        patch = '{"metadata":{"labels":{"sandbox":"forged"}}}'
        code, _, err = await as_gateway.run("patch", "pod", "p1", "-n", SANDBOX_NS, "-p", patch, check=False)
        assert code == 1
        assert (
            f'Error from server (Forbidden): pods "p1" is forbidden: User "{env.gateway_user}" cannot patch '
            f'resource "pods" in API group "" in the namespace "{SANDBOX_NS}"'
        ) in err
        # The admin may impersonate the ServiceAccount (`kubectl --as`), and is then held to its rules.
        as_admin = Kubectl(binary, tmp_path / "admin.yaml", cache)
        can_i = ("auth", "can-i", f"--as={env.gateway_user}", "-n", SANDBOX_NS)
        code, out, _ = await as_admin.run(*can_i, "create", "sandboxclaims.extensions.agents.x-k8s.io", check=False)
        assert (code, out.strip()) == (0, "yes")
        code, out, _ = await as_admin.run(*can_i, "create", "sandboxwarmpools.extensions.agents.x-k8s.io", check=False)
        assert (code, out.strip()) == (1, "no")
        # RBAC written with kubectl's own commands (protobuf bodies) takes effect at once.
        await as_admin.run("create", "role", "cm-reader", "-n", SANDBOX_NS, "--verb=get,list", "--resource=configmaps")
        await as_admin.run(
            "create", "clusterrole", "lease-lister", "--verb=list", "--resource=leases.coordination.k8s.io"
        )
        subject = f"--serviceaccount={RELEASE_NAMESPACE}:ws-warmshell"
        await as_admin.run("create", "rolebinding", "cm", "-n", SANDBOX_NS, "--role=cm-reader", subject)
        await as_admin.run("create", "clusterrolebinding", "leases", "--clusterrole=lease-lister", subject)
        stored = await client.RbacAuthorizationV1Api(env.admin).read_namespaced_role_binding("cm", SANDBOX_NS)
        assert stored.role_ref.name == "cm-reader"
        assert [(s.kind, s.name, s.namespace) for s in stored.subjects] == [
            ("ServiceAccount", "ws-warmshell", RELEASE_NAMESPACE)
        ]
        code, out, _ = await as_gateway.run("auth", "can-i", "list", "configmaps", "-n", SANDBOX_NS, check=False)
        assert (code, out.strip()) == (0, "yes")
        code, out, _ = await as_gateway.run("get", "leases", "-A", "-o", "name")
        assert out.split() == [f"lease.coordination.k8s.io/{env.lease_name}"]


async def test_rbac_writes_over_http_cannot_escalate(tmp_path: Path) -> None:
    async with chart_env(tmp_path, warm=False, profiles=False) as env:
        # The chart gives the gateway no RBAC rights at all: writing a Role is plainly forbidden.
        role = {"metadata": {"name": "reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
        gateway_rbac = client.RbacAuthorizationV1Api(env.gateway)
        assert await status_of(gateway_rbac.create_namespaced_role(SANDBOX_NS, role)) == 403
        # Allowed to write Roles there, it may grant what it holds (pods get) but nothing more.
        delegate = {
            "metadata": {"name": "delegate"},
            "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["create"]}],
        }
        admin_rbac = client.RbacAuthorizationV1Api(env.admin)
        await admin_rbac.create_namespaced_role(SANDBOX_NS, delegate)
        subject = {"kind": "ServiceAccount", "name": "ws-warmshell", "namespace": RELEASE_NAMESPACE}
        binding = {
            "metadata": {"name": "delegate"},
            "roleRef": {"kind": "Role", "name": "delegate"},
            "subjects": [subject],
        }
        await admin_rbac.create_namespaced_role_binding(SANDBOX_NS, binding)
        await gateway_rbac.create_namespaced_role(SANDBOX_NS, role)
        patcher = {"metadata": {"name": "patcher"}, "rules": [{**role["rules"][0], "verbs": ["patch"]}]}
        with pytest.raises(ApiException) as denied:
            await gateway_rbac.create_namespaced_role(SANDBOX_NS, patcher)
        assert denied.value.status == 403
        assert yaml.safe_load(denied.value.body)["message"] == (
            f'roles.rbac.authorization.k8s.io "patcher" is forbidden: user "{env.gateway_user}" '
            f'(groups=["system:serviceaccounts" "system:serviceaccounts:{RELEASE_NAMESPACE}" "system:authenticated"]) '
            'is attempting to grant RBAC permissions not currently held:\n{APIGroups:[""], Resources:["pods"], '
            'Verbs:["patch"]}'
        )
