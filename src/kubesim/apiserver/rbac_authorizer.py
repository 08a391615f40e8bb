"""``RbacAuthorizer``: the ``Authorizer`` a server uses with ``ServerConfig(rbac=True)``.

It answers from a ``rbac.Policy`` built from the store's Roles, ClusterRoles and bindings. A store
write hook marks the policy stale whenever an RBAC object changes, and the next decision rebuilds
it, so a burst of ``kubectl apply`` costs one rebuild and ordinary requests cost a dict lookup per
subject. ``system:masters`` (the admin token, the controllers, the kubelet, test setup) is allowed
everything without consulting RBAC, as kube-apiserver's privileged-group authorizer does.
``admit`` is the write-path half: nobody may create a role or binding granting more than they hold.
"""

from __future__ import annotations

from typing import Any

from kubesim.apiserver import errors, rbac, rbac_objects
from kubesim.apiserver.auth import CURRENT_USER, Attributes, User
from kubesim.apiserver.resources import Registry, ResourceType
from kubesim.apiserver.rest import Rest, WriteOptions
from kubesim.apiserver.store import Event, Store, Stored

SUPERUSER_GROUP = "system:masters"


class RbacAuthorizer:
    """Role-based access control over the objects in one server's store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._policy: rbac.Policy | None = None
        self.rebuilds = 0  # how often the policy was recomputed (tests check it stays cheap)
        store.hooks.append(self._on_write)

    def _on_write(self, group: str, plural: str, event: Event) -> None:
        if group == rbac_objects.GROUP:
            self._policy = None

    @property
    def policy(self) -> rbac.Policy:
        """The current policy, rebuilt if an RBAC object changed since the last decision."""
        if self._policy is None:
            store, group = self.store, rbac_objects.GROUP
            self._policy = rbac.Policy.build(
                roles=(s.obj for s in store.iter(group, "roles", None)),
                cluster_roles=(s.obj for s in store.iter(group, "clusterroles", None)),
                role_bindings=(s.obj for s in store.iter(group, "rolebindings", None)),
                cluster_role_bindings=(s.obj for s in store.iter(group, "clusterrolebindings", None)),
            )
            self.rebuilds += 1
        return self._policy

    def decide(self, attrs: Attributes) -> rbac.Decision:
        """Allowed or not, with upstream's reason (what access reviews report)."""
        if SUPERUSER_GROUP in attrs.user.groups:
            return rbac.Decision(True, "")
        return self.policy.decide(attrs)

    def rules_for(self, user: User, namespace: str) -> list[rbac.Obj]:
        """Everything ``user`` may do in ``namespace`` (SelfSubjectRulesReview); masters may do all."""
        if SUPERUSER_GROUP in user.groups:
            return [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ]
        return self.policy.rules_for(user, namespace)[0]

    def authorize(self, attrs: Attributes) -> str | None:
        """``None`` when allowed, else the denial reason (often empty, as RBAC's usually is)."""
        decision = self.decide(attrs)
        return None if decision.allowed else decision.reason

    def admit(self, rt: ResourceType, new: dict[str, Any], old: Stored | None) -> None:
        """Refuse a Role/ClusterRole/binding write that would grant more than its writer holds.

        As upstream: a role's rules must be covered by the writer's own rules in that namespace
        (cluster-wide for a ClusterRole) unless it may ``escalate``; a binding's role must be
        covered likewise unless the writer may ``bind`` it. Writes that leave the grant unchanged
        (labels, finalizers) are not checked, nor are the server's own in-process writes.
        """
        if rt.group != rbac_objects.GROUP:
            return
        user = CURRENT_USER.get()
        if user is None or SUPERUSER_GROUP in user.groups:
            return
        meta = new.get("metadata") or {}
        name, ns = str(meta.get("name", "")), str(meta.get("namespace", ""))
        policy = self.policy
        if rt.plural in rbac_objects.ROLE_KINDS:
            if old is not None and old.obj.get("rules") == new.get("rules"):
                return
            if policy.decide(Attributes(user, "escalate", rt.group, rt.plural, "", ns, name)).allowed:
                return
            wanted: list[rbac.Obj] = [r for r in new.get("rules") or () if isinstance(r, dict)]
        else:
            ref = new.get("roleRef") or {}
            if old is not None and (old.obj.get("roleRef"), old.obj.get("subjects")) == (ref, new.get("subjects")):
                return
            ref_plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            if policy.decide(Attributes(user, "bind", rt.group, ref_plural, "", ns, str(ref.get("name", "")))).allowed:
                return
            wanted = policy.role_ref_rules(ref, ns)
        held, resolution_errors = policy.rules_for(user, ns)
        missing = rbac.uncovered(held, wanted)
        if missing:
            reason = rbac.escalation_error(user, missing, resolution_errors)
            message = f'{errors.qualified(rt.plural, rt.group)} "{name}" is forbidden: {reason}'
            raise errors.forbidden(message, resource=rt.plural, group=rt.group, name=name)


def install_bootstrap_policy(rest: Rest, registry: Registry) -> None:
    """Create the bootstrap ClusterRoles and bindings that are missing (a restart keeps edits)."""
    roles, bindings = rbac_objects.bootstrap_policy()
    for plural, objects in (("clusterroles", roles), ("clusterrolebindings", bindings)):
        rt = registry.get(rbac_objects.GROUP, plural)
        assert rt is not None, f"{plural} must be registered before the bootstrap policy is installed"
        for obj in objects:
            if rest.store.get(rt.group, rt.plural, "", obj["metadata"]["name"]) is None:
                rest.create(rt, rbac_objects.VERSION, "", obj, WriteOptions())
