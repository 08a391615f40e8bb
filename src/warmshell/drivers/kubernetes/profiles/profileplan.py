"""What the profile reconciler should do, decided without I/O: profile ConfigMaps in, the
`SandboxTemplate` + `SandboxWarmPool` pairs they want, the writes and deletes that get the cluster
there, and the status annotations each ConfigMap should carry.

The reconciler (`profiles`) fetches, calls these, and writes. An invalid profile yields an Error
status and no writes — and none of its previously generated objects is deleted, so a typo in a
working profile never takes its pool away; the status says the old pool is kept.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from warmshell.core import profiles
from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.kubernetes import labels, naming
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.warm import warmpools

__all__ = [
    "Delete",
    "Desired",
    "Plan",
    "Write",
    "desire",
    "generated_name",
    "needs_update",
    "observed_version",
    "plan",
    "status_annotations",
    "status_patch",
]

Kind = Literal["template", "pool"]

PREFIX: Final = "warmshell-wp-"
MAX_NAME: Final = 63
FALLBACK: Final = "profile"
READY: Final = "Ready"
ERROR: Final = "Error"
# Profiles are parsed with a generous bound and then capped by the configured maximum: a profile
# asking for more still gets a pool (the status says so), rather than none.
PARSE_MAX_REPLICAS: Final = 1_000_000
_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9-]+")
_DASHES = re.compile(r"-{2,}")


def sanitize(text: str) -> str:
    """Lowercase, other characters mapped to `-`, runs collapsed, ends trimmed."""
    return _DASHES.sub("-", _NOT_LABEL_CHARS.sub("-", text.lower())).strip("-")


def generated_name(profile_name: str, fingerprint: str) -> str:
    """`warmshell-wp-<profile>-<first 8 hex>`, a DNS-1123 label (≤ 63 characters); the template
    and the pool share it. The hash keeps a changed profile's pair apart from its predecessor."""
    short = (sanitize(fingerprint)[:8] or "00000000").ljust(8, "0")
    room = MAX_NAME - len(PREFIX) - 1 - len(short)
    stem = sanitize(profile_name)[:room].rstrip("-") or FALLBACK
    return f"{PREFIX}{stem}-{short}"


@dataclass(frozen=True)
class Desired:
    """One profile ConfigMap and what it asks for: a pair to apply, or the error in words."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    annotations: Mapping[str, str]
    generated: str = ""
    target_namespace: str = ""
    fingerprint: str = ""
    replicas: int = 0
    capped_from: int = 0  # the replicas asked for, when above the maximum
    template: Obj | None = None
    pool: Obj | None = None
    error: str = ""

    @property
    def source(self) -> str:
        """`configmap <namespace>/<name>`: how messages name the profile."""
        return f"configmap {self.namespace}/{self.name}"


def desire(configmap: Mapping[str, Any], config: KubernetesDriverConfig) -> Desired:
    """Parse one profile ConfigMap (with the local driver's strict parser) and render its pair."""
    meta = configmap.get("metadata") or {}
    base = Desired(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        annotations=dict(meta.get("annotations") or {}),
    )
    text = (configmap.get("data") or {}).get(labels.PROFILE_DATA_KEY)
    if not isinstance(text, str):
        return _failed(base, f"{base.source}: data key {labels.PROFILE_DATA_KEY!r} is missing")
    try:
        profile = profiles.parse_profile(text, name=base.name, source=base.source, max_replicas=PARSE_MAX_REPLICAS)
        if profile.setup is not None:  # (images are built into the local driver's image store)
            rule = "is served by the local driver only; on Kubernetes name a prebuilt image as `image`"
            raise profiles.ProfileError(base.source, "setup", rule)
        shape = profile.shape(config.image)
        fingerprint = profile.fingerprint(config.image)
        target = naming.object_ref(config, profile.workspace, "p").namespace
        name = generated_name(profile.name, fingerprint)
        replicas = min(profile.replicas, config.warm_pooling.profiles.max_replicas)
        template, pool = warmpools.render_pool_pair(
            config,
            name=name,
            namespace=target,
            shape=shape,
            replicas=replicas,
            extra_labels={labels.PROFILE_NAME: sanitize(base.name) or FALLBACK, labels.PROFILE_UID: base.uid},
            ttl_seconds=profile.ttl_seconds,
            idle_timeout_seconds=profile.idle_timeout_seconds,
            storage=profile.storage,
            network=warmpools.PoolEgress(profile.network_allow, profile.network_deny, profile.secret_hosts),
        )
    except InvalidArgumentError as exc:
        return _failed(base, str(exc))
    for obj in (template, pool):
        _stamp_provenance(obj, base)
    return dataclasses.replace(
        base,
        generated=name,
        target_namespace=target,
        fingerprint=fingerprint,
        replicas=replicas,
        capped_from=profile.replicas if profile.replicas > replicas else 0,
        template=template,
        pool=pool,
    )


def _failed(base: Desired, message: str) -> Desired:
    return dataclasses.replace(base, error=message)


def _stamp_provenance(obj: Obj, source: Desired) -> None:
    """Name the source ConfigMap on a generated object, and make it an owner where Kubernetes
    allows (same namespace) so deleting the profile deletes its pair even with no gateway up.
    Not blockOwnerDeletion: that would need `update` on the ConfigMap's finalizers."""
    meta = obj["metadata"]
    meta["annotations"][labels.PROFILE_SOURCE] = f"{source.namespace}/{source.name}"
    if meta["namespace"] == source.namespace and source.uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": source.name, "uid": source.uid}]


# -- the plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """Create `body`, or merge-patch the existing object with it."""

    action: Literal["create", "patch"]
    kind: Kind
    profile_uid: str
    body: Obj

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


@dataclass(frozen=True)
class Delete:
    """Delete a generated object (uid as precondition) and why."""

    kind: Kind
    namespace: str
    name: str
    uid: str
    reason: str
    profile_uid: str = ""  # set when superseded: the profile whose new pair replaces it


@dataclass
class Plan:
    """Writes (each template before its pool), then deletes (pools before their templates), and
    per-profile errors the plan itself found; `kept` are the generated names an invalid profile
    keeps serving, by profile uid."""

    writes: list[Write] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    kept: dict[str, list[str]] = field(default_factory=dict)


def plan(desired: Sequence[Desired], templates: Iterable[Obj], pools: Iterable[Obj]) -> Plan:
    """Compare the desired pairs with the generated objects that exist (both kinds, listed with
    `labels.generated_selector()`), and decide."""
    existing: dict[Kind, dict[tuple[str, str], Obj]] = {
        "template": {_key(o): o for o in templates},
        "pool": {_key(o): o for o in pools},
    }
    result = Plan()
    owners = _claim_names(desired, result)
    for want in desired:
        if want.template is None or want.pool is None or want.uid in result.errors:
            continue
        pair: tuple[tuple[Kind, Obj], ...] = (("template", want.template), ("pool", want.pool))
        for kind, body in pair:
            current = existing[kind].get((want.target_namespace, want.generated))
            if current is None:
                result.writes.append(Write("create", kind, want.uid, body))
            elif needs_update(body, current):
                result.writes.append(Write("patch", kind, want.uid, body))
    by_uid = {d.uid: d for d in desired}
    order: tuple[Kind, ...] = ("pool", "template")  # a pool goes before the template it uses
    for kind in order:
        for key, obj in sorted(existing[kind].items()):
            reason = _why_delete(obj, key, by_uid, owners, result)
            if reason:
                uid = str(obj["metadata"].get("uid") or "")
                source = _profile_uid(obj) if reason.startswith("superseded") else ""
                result.deletes.append(Delete(kind, key[0], key[1], uid, reason, source))
    return result


def _claim_names(desired: Sequence[Desired], result: Plan) -> dict[tuple[str, str], str]:
    """Which profile uid owns each generated name; a second profile sanitising to the same name
    and shape gets an error instead of fighting over the objects."""
    owners: dict[tuple[str, str], str] = {}
    for want in sorted(desired, key=lambda d: (d.namespace, d.name)):
        if want.template is None:
            continue
        key = (want.target_namespace, want.generated)
        if key in owners:
            first = next(d for d in desired if d.uid == owners[key])
            result.errors[want.uid] = (
                f"{want.source}: generates {want.generated}, which {first.source} already generates; rename one"
            )
            continue
        owners[key] = want.uid
    return owners


def _why_delete(
    obj: Obj, key: tuple[str, str], by_uid: Mapping[str, Desired], owners: Mapping[tuple[str, str], str], result: Plan
) -> str:
    if key in owners:
        return ""  # a current profile generates this name: it is written (relabelled), not deleted
    uid = _profile_uid(obj)
    source = by_uid.get(uid)
    if source is None:
        return "orphaned: its profile ConfigMap is gone"
    if source.template is None or uid in result.errors:
        # Invalid now: keep what it generated before, and say so on its status.
        kept = result.kept.setdefault(uid, [])
        if key[1] not in kept:
            kept.append(key[1])
        return ""
    return f"superseded: {source.source} now generates {source.generated}"


def _profile_uid(obj: Obj) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(labels.PROFILE_UID) or "")


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def needs_update(desired: Obj, existing: Obj) -> bool:
    """Whether `existing` lacks anything `desired` sets: labels, annotations, ownerReferences or
    spec. Extra fields on `existing` (API defaults, agent-sandbox's own labels) do not count."""
    want_meta, have_meta = desired["metadata"], existing.get("metadata") or {}
    for key in ("labels", "annotations", "ownerReferences"):
        if key in want_meta and not _contains(have_meta.get(key), want_meta[key]):
            return True
    return not _contains(existing.get("spec"), desired["spec"])


def _contains(have: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _contains(have[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(map(_contains, have, want))
    return bool(have == want)


def patch_body(write: Write) -> Obj:
    """The merge patch that brings an existing object to `write.body` (metadata we own, spec)."""
    meta = write.body["metadata"]
    patch_meta = {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta}
    return {"metadata": patch_meta, "spec": write.body["spec"]}


# -- status -----------------------------------------------------------------------------------------


def observed_version(want: Desired, own_write: str | None) -> str:
    """The ConfigMap version the status describes. Our own status write bumps the version without
    changing the profile, so a version we wrote ourselves keeps the one already annotated —
    otherwise every status write would ask for the next one."""
    if own_write is not None and own_write == want.resource_version:
        return want.annotations.get(labels.PROFILE_OBSERVED_VERSION) or want.resource_version
    return want.resource_version


def status_annotations(
    want: Desired, *, error: str = "", kept: Sequence[str] = (), observed: str
) -> dict[str, str | None]:
    """The annotations the ConfigMap should carry (None: remove)."""
    message = error or want.error
    if message:
        if kept:
            message += f"; keeping the previously generated {', '.join(kept)} (still serving)"
        return {
            labels.PROFILE_STATUS: ERROR,
            labels.PROFILE_LAST_ERROR: message,
            labels.PROFILE_OBSERVED_VERSION: observed,
            labels.PROFILE_GENERATED: ",".join(kept) or None,
        }
    ready: dict[str, str | None] = {
        labels.PROFILE_STATUS: READY,
        labels.PROFILE_LAST_ERROR: None,
        labels.PROFILE_OBSERVED_VERSION: observed,
        labels.PROFILE_TARGET_NAMESPACE: want.target_namespace,
        labels.PROFILE_GENERATED: want.generated,
        labels.PROFILE_FINGERPRINT: want.fingerprint,
    }
    if want.capped_from:
        ready[labels.PROFILE_LAST_ERROR] = (
            f"replicas {want.capped_from} capped to {want.replicas} (the gateway's max_replicas)"
        )
    return ready


def status_patch(want: Desired, annotations: Mapping[str, str | None]) -> Obj | None:
    """A merge patch setting `annotations` on the ConfigMap, or None when it already has them."""
    changed = {k: v for k, v in annotations.items() if want.annotations.get(k) != v}
    return {"metadata": {"annotations": changed}} if changed else None
