"""RBAC evaluation: does a set of Roles, ClusterRoles and bindings allow one request?

Pure functions over plain dicts (the stored objects), following k8s.io/kubernetes/plugin/pkg/auth/
authorizer/rbac: a request is allowed when some rule of some role bound to the user (directly, via
one of its groups, or as a ServiceAccount) matches it. ClusterRoleBindings grant everywhere; a
RoleBinding grants only in its own namespace, whether it refers to a Role or to a ClusterRole.
Nothing ever denies: a request no rule allows is simply not allowed. Aggregated ClusterRoles are not
modelled (their ``rules`` are used as stored).

``Policy`` indexes bindings by subject once, so a decision looks only at the bindings that name the
user or one of its groups; the authorizer in ``rbac_authorizer`` rebuilds it when RBAC objects change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesim.apiserver.auth import Attributes, User

GROUP = "rbac.authorization.k8s.io"
SA_PREFIX = "system:serviceaccount:"
ALL = "*"

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Decision:
    """An answer with upstream's reason text (``RBAC: allowed by ...`` or the resolution errors)."""

    allowed: bool
    reason: str = ""


def is_resource_request(attrs: Attributes) -> bool:
    """Resource requests name a resource; everything else is a non-resource URL (``/apis``...)."""
    return bool(attrs.resource)


def _verb_matches(rule: Obj, verb: str) -> bool:
    verbs = rule.get("verbs") or ()
    return ALL in verbs or verb in verbs


def _group_matches(rule: Obj, group: str) -> bool:
    groups = rule.get("apiGroups") or ()
    return ALL in groups or group in groups


def _resource_matches(rule: Obj, resource: str, subresource: str) -> bool:
    # As upstream's ResourceMatches: "*", the exact "resource[/subresource]", or "*/subresource".
    combined = f"{resource}/{subresource}" if subresource else resource
    for candidate in rule.get("resources") or ():
        if candidate in (ALL, combined):
            return True
        if subresource and candidate == "*/" + subresource:
            return True
    return False


def _name_matches(rule: Obj, name: str) -> bool:
    names = rule.get("resourceNames") or ()
    return not names or name in names


def _url_matches(rule: Obj, path: str) -> bool:
    for url in rule.get("nonResourceURLs") or ():
        if url in (ALL, path):
            return True
        if url.endswith(ALL) and path.startswith(url[:-1]):
            return True
    return False


def rule_allows(rule: Obj, attrs: Attributes) -> bool:
    """Whether one PolicyRule allows the request (upstream's ``RuleAllows``)."""
    if not _verb_matches(rule, attrs.verb):
        return False
    if is_resource_request(attrs):
        return (
            _group_matches(rule, attrs.group)
            and _resource_matches(rule, attrs.resource, attrs.subresource)
            and _name_matches(rule, attrs.name)
        )
    return _url_matches(rule, attrs.path)


def service_account_username(namespace: str, name: str) -> str:
    """``system:serviceaccount:<ns>:<name>``: the user a ServiceAccount's tokens authenticate as."""
    return f"{SA_PREFIX}{namespace}:{name}"


def _subject_key(subject: Obj, binding_namespace: str) -> str | None:
    """The index key a subject matches: ``user:<name>`` or ``group:<name>``; None if unusable."""
    kind = subject.get("kind")
    name = subject.get("name") or ""
    if not name:
        return None
    if kind == "User":
        return "user:" + name
    if kind == "Group":
        return "group:" + name
    if kind == "ServiceAccount":
        # A RoleBinding's ServiceAccount subject may omit its namespace: it means the binding's.
        namespace = subject.get("namespace") or binding_namespace
        return "user:" + service_account_username(namespace, name) if namespace else None
    return None


def _describe_subject(subject: Obj, binding_namespace: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return f'ServiceAccount "{subject.get("name", "")}/{namespace}"'
    return f'{subject.get("kind", "")} "{subject.get("name", "")}"'


@dataclass(frozen=True)
class _Grant:
    """One binding seen from one of its subjects."""

    binding: Obj
    subject: Obj
    namespace: str  # "" for a ClusterRoleBinding


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


@dataclass
class Policy:
    """A snapshot of the cluster's RBAC objects, with bindings indexed by subject."""

    roles: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (namespace, name)
    cluster_roles: dict[str, Obj] = field(default_factory=dict)
    cluster_grants: dict[str, list[_Grant]] = field(default_factory=dict)  # subject key -> grants
    namespaced_grants: dict[tuple[str, str], list[_Grant]] = field(default_factory=dict)  # (key, ns)

    @classmethod
    def build(
        cls,
        *,
        roles: Iterable[Obj] = (),
        cluster_roles: Iterable[Obj] = (),
        role_bindings: Iterable[Obj] = (),
        cluster_role_bindings: Iterable[Obj] = (),
    ) -> Policy:
        """Index the four kinds (as stored dicts)."""
        policy = cls()
        for role in roles:
            meta = _meta(role)
            policy.roles[(meta.get("namespace", ""), meta.get("name", ""))] = role
        for role in cluster_roles:
            policy.cluster_roles[_meta(role).get("name", "")] = role
        for binding in cluster_role_bindings:
            for subject in binding.get("subjects") or ():
                key = _subject_key(subject, "")
                if key is not None:
                    policy.cluster_grants.setdefault(key, []).append(_Grant(binding, subject, ""))
        for binding in role_bindings:
            namespace = _meta(binding).get("namespace", "")
            for subject in binding.get("subjects") or ():
                key = _subject_key(subject, namespace)
                if key is not None:
                    grant = _Grant(binding, subject, namespace)
                    policy.namespaced_grants.setdefault((key, namespace), []).append(grant)
        return policy

    def _role_rules(self, grant: _Grant, errors: list[str]) -> list[Obj] | None:
        ref = grant.binding.get("roleRef") or {}
        kind, name = ref.get("kind"), ref.get("name", "")
        if kind == "ClusterRole":
            role = self.cluster_roles.get(name)
            missing = f'clusterrole.{GROUP} "{name}" not found'
        elif kind == "Role" and grant.namespace:
            role = self.roles.get((grant.namespace, name))
            missing = f'role.{GROUP} "{name}" not found'
        else:
            return None
        if role is None:
            errors.append(missing)
            return None
        return [r for r in role.get("rules") or () if isinstance(r, Mapping)]

    def _describe(self, grant: _Grant) -> str:
        meta = _meta(grant.binding)
        ref = grant.binding.get("roleRef") or {}
        role = f'{ref.get("kind", "")} "{ref.get("name", "")}"'
        subject = _describe_subject(grant.subject, grant.namespace)
        if grant.namespace:
            return f'RoleBinding "{meta.get("name", "")}/{grant.namespace}" of {role} to {subject}'
        return f'ClusterRoleBinding "{meta.get("name", "")}" of {role} to {subject}'

    def grants_for(self, attrs: Attributes) -> list[_Grant]:
        """The bindings that could apply: naming the user or one of its groups, in scope."""
        keys = ["user:" + attrs.user.username, *("group:" + g for g in attrs.user.groups)]
        found: list[_Grant] = []
        for key in keys:
            found.extend(self.cluster_grants.get(key, ()))
        # RoleBindings count only for requests inside their namespace (never for cluster scope).
        if attrs.namespace:
            for key in keys:
                found.extend(self.namespaced_grants.get((key, attrs.namespace), ()))
        return found

    def rules_for(self, user: User, namespace: str) -> tuple[list[Obj], list[str]]:
        """Every rule the user holds in ``namespace`` ("" = cluster-wide only), and resolution errors."""
        errors: list[str] = []
        rules: list[Obj] = []
        for grant in self.grants_for(Attributes(user, "", namespace=namespace)):
            rules.extend(self._role_rules(grant, errors) or ())
        return rules, errors

    def role_ref_rules(self, ref: Obj, namespace: str) -> list[Obj]:
        """The rules a binding's ``roleRef`` grants (none if the role does not exist yet)."""
        if ref.get("kind") == "ClusterRole":
            role = self.cluster_roles.get(ref.get("name", ""))
        else:
            role = self.roles.get((namespace, ref.get("name", "")))
        return [r for r in (role or {}).get("rules") or () if isinstance(r, Mapping)]

    def decide(self, attrs: Attributes) -> Decision:
        """Allowed iff a rule of a bound role matches; the reason mirrors upstream's wording."""
        errors: list[str] = []
        for grant in self.grants_for(attrs):
            rules = self._role_rules(grant, errors)
            if rules is None:
                continue
            if any(rule_allows(rule, attrs) for rule in rules):
                return Decision(True, "RBAC: allowed by " + self._describe(grant))
        unique = list(dict.fromkeys(errors))
        if not unique:
            return Decision(False, "")
        text = unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"
        return Decision(False, "RBAC: " + text)


def forbidden_message(attrs: Attributes, reason: str = "") -> str:
    """The ``Status`` message of a denied request, word for word as kube-apiserver writes it."""
    user = attrs.user.username
    if not is_resource_request(attrs):
        text = f'User "{user}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        text = f'User "{user}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}"'
        text += f' in the namespace "{attrs.namespace}"' if attrs.namespace else " at the cluster scope"
    if reason:
        text += ": " + reason
    if not is_resource_request(attrs):
        return "forbidden: " + text
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    if attrs.name:
        return f'{qualified} "{attrs.name}" is forbidden: {text}'
    return f"{qualified} is forbidden: {text}"


# ---- escalation prevention -----------------------------------------------------------------------
#
# Nobody may grant what they do not hold: creating a role, or binding one, needs every one of its
# rules to be covered by the creator's own rules (or the ``escalate``/``bind`` verb). This is
# upstream's pkg/registry/rbac/validation (Covers, BreakdownRule, CompactRules, CompactString).


def breakdown(rule: Obj) -> list[dict[str, list[str]]]:
    """One rule per (group, resource, verb, name) or (URL, verb): the units coverage is checked in."""
    out: list[dict[str, list[str]]] = []
    verbs = list(rule.get("verbs") or ())
    for group in rule.get("apiGroups") or ():
        for resource in rule.get("resources") or ():
            for verb in verbs:
                names = list(rule.get("resourceNames") or ())
                if names:
                    out.extend(
                        {"apiGroups": [group], "resources": [resource], "verbs": [verb], "resourceNames": [n]}
                        for n in names
                    )
                else:
                    out.append({"apiGroups": [group], "resources": [resource], "verbs": [verb]})
    for url in rule.get("nonResourceURLs") or ():
        out.extend({"nonResourceURLs": [url], "verbs": [verb]} for verb in verbs)
    return out


def _has_all(owner: Iterable[str], wanted: Iterable[str]) -> bool:
    return set(wanted) <= set(owner)


def _resources_cover(owner: list[str], wanted: list[str]) -> bool:
    if ALL in owner or _has_all(owner, wanted):
        return True
    for resource in wanted:
        # "*/status" in the owner covers any "<x>/status".
        if resource in owner or ("/" in resource and "*/" + resource.split("/", 1)[1] in owner):
            continue
        return False
    return True


def _urls_cover(owner: list[str], wanted: list[str]) -> bool:
    return all(any(o == url or (o.endswith(ALL) and url.startswith(o[:-1])) for o in owner) for url in wanted)


def rule_covers(owner: Obj, wanted: Obj) -> bool:
    """Whether ``owner`` grants at least what ``wanted`` grants (upstream's ``ruleCovers``)."""
    o_verbs, o_groups = list(owner.get("verbs") or ()), list(owner.get("apiGroups") or ())
    o_names = list(owner.get("resourceNames") or ())
    w_names = list(wanted.get("resourceNames") or ())
    names_ok = not o_names if not w_names else (not o_names or _has_all(o_names, w_names))
    return (
        (ALL in o_verbs or _has_all(o_verbs, wanted.get("verbs") or ()))
        and (ALL in o_groups or _has_all(o_groups, wanted.get("apiGroups") or ()))
        and _resources_cover(list(owner.get("resources") or ()), list(wanted.get("resources") or ()))
        and _urls_cover(list(owner.get("nonResourceURLs") or ()), list(wanted.get("nonResourceURLs") or ()))
        and names_ok
    )


def uncovered(owner_rules: Iterable[Obj], wanted_rules: Iterable[Obj]) -> list[dict[str, list[str]]]:
    """The broken-down parts of ``wanted_rules`` that no owner rule covers (empty: no escalation)."""
    owners = list(owner_rules)
    return [atom for rule in wanted_rules for atom in breakdown(rule) if not any(rule_covers(o, atom) for o in owners)]


def compact(rules: list[dict[str, list[str]]]) -> list[dict[str, list[str]]]:
    """Merge broken-down rules that differ only in their verb, as upstream's ``CompactRules``."""
    merged: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    others: list[dict[str, list[str]]] = []
    for rule in rules:
        if rule.get("nonResourceURLs"):
            others.append(rule)
            continue
        key = (rule["apiGroups"][0], rule["resources"][0], "".join(rule.get("resourceNames", [])))
        if key in merged:
            merged[key]["verbs"] = merged[key]["verbs"] + rule["verbs"]
        else:
            merged[key] = {k: list(v) for k, v in rule.items()}
    return others + list(merged.values())


def _go_quoted(values: Iterable[str]) -> str:
    # Go's %q of a []string: ["a" "b"].
    return "[" + " ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"


def compact_string(rule: Obj) -> str:
    """``{APIGroups:[""], Resources:["pods"], Verbs:["patch"]}``: how upstream lists missing rights."""
    parts = []
    for key, label in (
        ("apiGroups", "APIGroups"),
        ("resources", "Resources"),
        ("nonResourceURLs", "NonResourceURLs"),
        ("resourceNames", "ResourceNames"),
        ("verbs", "Verbs"),
    ):
        if rule.get(key):
            parts.append(f"{label}:{_go_quoted(rule[key])}")
    return "{" + ", ".join(parts) + "}"


def escalation_error(user: User, missing: list[dict[str, list[str]]], errors: list[str]) -> str:
    """The reason a create/update that would grant ``missing`` is forbidden, in upstream's words."""
    described = sorted({compact_string(rule) for rule in compact(missing)})
    text = (
        f'user "{user.username}" (groups={_go_quoted(user.groups)}) is attempting to grant RBAC permissions '
        "not currently held:\n" + "\n".join(described)
    )
    if errors:
        text += "; resolution errors: [" + " ".join(errors) + "]"
    return text
