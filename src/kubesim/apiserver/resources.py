"""The resource catalogue: which group/version/plural the server serves and how.

Built-in kinds are declared here; custom resources are added and removed when CRD objects are
written (see ``crds``). Discovery, routing and storage all read this one registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubesim.apiserver.schema import Schema

READ_WRITE = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass
class VersionInfo:
    """One served version of a resource; CRDs carry a compiled schema per version."""

    name: str
    schema: Schema | None = None
    # The CRD version's openAPIV3Schema as written (what the OpenAPI documents publish).
    openapi_schema: dict[str, Any] | None = None
    deprecated: bool = False
    deprecation_warning: str = ""
    printer_columns: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ResourceType:
    """A served resource (``pods``, ``sandboxes.agents.x-k8s.io``) across its served versions."""

    group: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    versions: dict[str, VersionInfo]
    storage_version: str
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    verbs: tuple[str, ...] = READ_WRITE
    subresources: tuple[str, ...] = ()
    # For CRDs with a scale subresource: {specReplicasPath, statusReplicasPath, labelSelectorPath}.
    scale: dict[str, str] | None = None
    custom: bool = False
    # "Has status" decides whether writes to the main resource ignore status and vice versa.
    list_kind: str = ""

    def __post_init__(self) -> None:
        if not self.list_kind:
            self.list_kind = self.kind + "List"

    @property
    def key(self) -> tuple[str, str]:
        """Group and plural: how the store indexes this resource."""
        return (self.group, self.plural)

    def api_version(self, version: str | None = None) -> str:
        """``v1`` or ``group/version``."""
        v = version or self.storage_version
        return f"{self.group}/{v}" if self.group else v

    @property
    def has_status(self) -> bool:
        """Whether status is a separate subresource (writes to the main path ignore status)."""
        return "status" in self.subresources


def _core(
    plural: str,
    kind: str,
    *,
    namespaced: bool = True,
    short: tuple[str, ...] = (),
    sub: tuple[str, ...] = (),
    group: str = "",
    version: str = "v1",
    verbs: tuple[str, ...] = READ_WRITE,
    categories: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group=group,
        plural=plural,
        kind=kind,
        singular=kind.lower(),
        namespaced=namespaced,
        versions={version: VersionInfo(version)},
        storage_version=version,
        short_names=list(short),
        subresources=sub,
        verbs=verbs,
        categories=list(categories),
    )


DEPLOYMENT_SUB = ("scale", "status")


def _scalable(rt: ResourceType) -> ResourceType:
    # Deployments and ReplicaSets: /scale over spec.replicas and status.replicas.
    rt.scale = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}
    return rt


def builtin_resources() -> list[ResourceType]:
    """The built-in kinds kubesim serves (what warmshell, agent-sandbox and a kubelet touch)."""
    return [
        _core("namespaces", "Namespace", namespaced=False, short=("ns",), sub=("status", "finalize")),
        _core(
            "pods",
            "Pod",
            short=("po",),
            sub=("status", "binding"),
            categories=("all",),
        ),
        _core("configmaps", "ConfigMap", short=("cm",)),
        _core("secrets", "Secret"),
        _core("services", "Service", short=("svc",), sub=("status",), categories=("all",)),
        _core("serviceaccounts", "ServiceAccount", short=("sa",), sub=("token",)),
        _core("events", "Event", short=("ev",)),
        _core("nodes", "Node", namespaced=False, short=("no",), sub=("status",)),
        _core("persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), sub=("status",)),
        _core("endpoints", "Endpoints", short=("ep",)),
        _core("events", "Event", short=("ev",), group="events.k8s.io"),
        _scalable(
            _core("deployments", "Deployment", short=("deploy",), sub=DEPLOYMENT_SUB, group="apps", categories=("all",))
        ),
        _scalable(
            _core("replicasets", "ReplicaSet", short=("rs",), sub=DEPLOYMENT_SUB, group="apps", categories=("all",))
        ),
        _core("poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",), sub=("status",), group="policy"),
        _core("endpointslices", "EndpointSlice", group="discovery.k8s.io"),
        _core("leases", "Lease", group="coordination.k8s.io"),
        _core("networkpolicies", "NetworkPolicy", short=("netpol",), group="networking.k8s.io"),
        _core(
            "tokenreviews",
            "TokenReview",
            namespaced=False,
            group="authentication.k8s.io",
            verbs=("create",),
        ),
        _core(
            "selfsubjectreviews",
            "SelfSubjectReview",
            namespaced=False,
            group="authentication.k8s.io",
            verbs=("create",),
        ),
        _core(
            "selfsubjectaccessreviews",
            "SelfSubjectAccessReview",
            namespaced=False,
            group="authorization.k8s.io",
            verbs=("create",),
        ),
        _core(
            "selfsubjectrulesreviews",
            "SelfSubjectRulesReview",
            namespaced=False,
            group="authorization.k8s.io",
            verbs=("create",),
        ),
        _core(
            "subjectaccessreviews",
            "SubjectAccessReview",
            namespaced=False,
            group="authorization.k8s.io",
            verbs=("create",),
        ),
        _core("roles", "Role", group="rbac.authorization.k8s.io"),
        _core("rolebindings", "RoleBinding", group="rbac.authorization.k8s.io"),
        _core("clusterroles", "ClusterRole", namespaced=False, group="rbac.authorization.k8s.io"),
        _core("clusterrolebindings", "ClusterRoleBinding", namespaced=False, group="rbac.authorization.k8s.io"),
        _core(
            "customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            short=("crd", "crds"),
            sub=("status",),
            group="apiextensions.k8s.io",
        ),
    ]


# Objects of these kinds are never stored: the create verb computes an answer and returns it.
VIRTUAL = {
    ("authentication.k8s.io", "tokenreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
}


class Registry:
    """Every served resource, looked up by (group, plural) or by (group, version, plural)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], ResourceType] = {}
        # Moves on every add/remove, so derived documents (OpenAPI) know when to rebuild.
        self.generation = 0
        for rt in builtin_resources():
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        """Register (or replace) a resource."""
        self._by_key[rt.key] = rt
        self.generation += 1

    def remove(self, group: str, plural: str) -> None:
        """Stop serving a resource (a CRD was deleted)."""
        self._by_key.pop((group, plural), None)
        self.generation += 1

    def get(self, group: str, plural: str) -> ResourceType | None:
        """The resource for a group and plural, whatever version."""
        return self._by_key.get((group, plural))

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The resource if it is served at this version."""
        rt = self._by_key.get((group, plural))
        if rt is None or version not in rt.versions:
            return None
        return rt

    def all(self) -> list[ResourceType]:
        """All served resources, in registration order."""
        return list(self._by_key.values())

    def group_versions(self) -> dict[str, list[str]]:
        """group → served versions (preferred first); the core group is ``""``."""
        out: dict[str, list[str]] = {}
        for rt in self._by_key.values():
            versions = out.setdefault(rt.group, [])
            ordered = [rt.storage_version] + [v for v in rt.versions if v != rt.storage_version]
            for v in ordered:
                if v not in versions:
                    versions.append(v)
        return out
