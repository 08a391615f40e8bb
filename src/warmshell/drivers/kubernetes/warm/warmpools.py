"""Pure rendering and reading of warm pools: the `SandboxTemplate` + `SandboxWarmPool` pair that
serves one sandbox shape, and the shape a template actually runs.

The pair is written by the profile reconciler (and by operators with kubectl); the pool cache
reads templates back with `shape_of_template` and refuses a pool whose fingerprint label disagrees
with what its template runs, so a mislabelled pool can never serve a request of another shape. The
pool also carries its profile's lifetime defaults as annotations, read back with `lifetime_of`,
and its `[network]` rules and secret hosts, read back with `egress_of`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from warmshell.core import egress
from warmshell.core.apiranges import MAX_LIFETIME_SECONDS
from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.fingerprints import SandboxShape, fingerprint, matches_any, pattern_set
from warmshell.core.models import Storage
from warmshell.core.quantities import cpu_millis, memory_bytes
from warmshell.core.validation import validate_environment_patterns
from warmshell.drivers.kubernetes import labels, rendering
from warmshell.drivers.kubernetes.objects import Obj

__all__ = [
    "EXTENSIONS_API_VERSION",
    "PoolEgress",
    "egress_of",
    "fingerprint_label",
    "lifetime_of",
    "render_pool_pair",
    "shape_of_template",
]


EXTENSIONS_API_VERSION: Final = "extensions.agents.x-k8s.io/v1beta1"
_NO_STORAGE: Final = Storage()


@dataclass(frozen=True)
class PoolEgress:
    """A profile's `[network]` allow (None: the gateway's default) and deny lists and its
    `[activation] secret_hosts`, as written: what the gateway applies at activation to the
    sandboxes the pool serves."""

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    secret_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


_NO_EGRESS: Final = PoolEgress()


def fingerprint_label(full: str) -> str:
    """The label form of a fingerprint (label values are at most 63 characters)."""
    return full[: labels.FINGERPRINT_LABEL_LENGTH]


def render_pool_pair(
    config: KubernetesDriverConfig,
    *,
    name: str,
    namespace: str,
    shape: SandboxShape,
    replicas: int,
    extra_labels: Mapping[str, str] = {},
    ttl_seconds: int | None = None,
    idle_timeout_seconds: int | None = None,
    storage: Storage = _NO_STORAGE,
    network: PoolEgress = _NO_EGRESS,
) -> tuple[Obj, Obj]:
    """The (SandboxTemplate, SandboxWarmPool) serving `shape`; both named `name`. The pool carries
    the lifetime defaults (None: the gateway's) and `network` as annotations; the template's workspace volume
    has `storage.workspace` as its size limit (`storage.tmp` has no volume of its own here: /tmp
    is the container's writable layer, bounded by the node's ephemeral storage).

    The template's pod is the cold sandbox's supervisor pod without any per-sandbox identity
    (identity comes from the claim at activation) and with the shape's environment baked in, so
    the shape can be read back from the template (`shape_of_template`).
    """
    full = fingerprint(shape)
    metadata_labels = {
        **extra_labels,
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.WARM_POOL: labels.WARM_POOL_ENABLED,
        labels.FINGERPRINT: fingerprint_label(full),
    }
    annotations = {labels.FINGERPRINT: full, labels.WORKSPACE: shape.workspace}
    template = _template(config, _meta(name, namespace, metadata_labels, annotations), shape, storage)
    # Both always written ("" = not set), so a default removed from a profile is patched away.
    lifetimes = {
        labels.TTL_SECONDS: _seconds_text(ttl_seconds),
        labels.IDLE_TIMEOUT_SECONDS: _seconds_text(idle_timeout_seconds),
        **_egress_annotations(network),
    }
    pool: Obj = {
        "apiVersion": EXTENSIONS_API_VERSION,
        "kind": "SandboxWarmPool",
        "metadata": _meta(name, namespace, metadata_labels, {**annotations, **lifetimes}),
        # Recreate: idle members that no longer match their template (the pod's shape changed
        # under the same profile, e.g. a warmshell upgrade) are replaced at once, not when
        # claimed (identity would refuse them then: `shape_of_template`).
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": name}, "updateStrategy": {"type": "Recreate"}},
    }
    return template, pool


def _meta(name: str, namespace: str, object_labels: Mapping[str, str], annotations: Mapping[str, str]) -> Obj:
    return {"name": name, "namespace": namespace, "labels": dict(object_labels), "annotations": dict(annotations)}


def _template(config: KubernetesDriverConfig, metadata: Obj, shape: SandboxShape, storage: Storage) -> Obj:
    """The SandboxTemplate whose pods run `shape`'s supervisor, without any sandbox's identity."""
    pod = rendering.pod_spec(
        config,
        image=shape.image,
        cpu_millis=shape.cpu_millis,
        memory_bytes=shape.memory_bytes,
        runtime_class_name=shape.runtime_class_name,
        environment=shape.environment,
        workspace_size=storage.workspace,
    )
    # Always written ("" = no limit): a template holding only a sizeLimit that the profile no
    # longer sets would otherwise look up to date, and keep it.
    metadata["annotations"][labels.WORKSPACE_SIZE] = storage.workspace
    return {
        "apiVersion": EXTENSIONS_API_VERSION,
        "kind": "SandboxTemplate",
        "metadata": metadata,
        "spec": {
            "podTemplate": {
                # Pool members are ours but belong to no sandbox yet: no sandbox-id label, so
                # they never enter the driver's list or watch of sandboxes.
                "metadata": {
                    "labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.WORKSPACE: shape.workspace},
                    **_accepted_annotation(shape),
                },
                "spec": pod,
            },
            # Unmanaged: agent-sandbox's default NetworkPolicy denies egress to private ranges,
            # which would cut the supervisor off from the gateway, and forces public DNS, which
            # cannot resolve the gateway's Service. Cold sandboxes get no policy either.
            "networkPolicyManagement": "Unmanaged",
            **rendering.workspace_claims(config, workspace_size=storage.workspace),
        },
    }


def _seconds_text(seconds: int | None) -> str:
    return "" if seconds is None else str(seconds)


def lifetime_of(pool: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The (ttl_seconds, idle_timeout_seconds) defaults a pool's annotations give the sandboxes it
    serves (None: not set); InvalidArgumentError names a malformed annotation."""
    annotations = (pool.get("metadata") or {}).get("annotations") or {}
    return _seconds_of(annotations, labels.TTL_SECONDS), _seconds_of(annotations, labels.IDLE_TIMEOUT_SECONDS)


def _seconds_of(annotations: Mapping[str, Any], key: str) -> int | None:
    text = annotations.get(key)
    if text is None or text == "":
        return None
    # isascii: str.isdigit also accepts other scripts' digits, which no operator means here.
    if not isinstance(text, str) or not (text.isascii() and text.isdigit()) or int(text) > MAX_LIFETIME_SECONDS:
        rule = f"{text!r} is not a whole number of seconds from 0 (no limit) to {MAX_LIFETIME_SECONDS}"
        raise InvalidArgumentError(f"annotation {key}", rule)
    return int(text)


def _egress_annotations(network: PoolEgress) -> dict[str, str]:
    """Always all three ("" = not set), so rules removed from a profile are patched away."""
    return {
        labels.NETWORK_ALLOW: json.dumps(list(network.allow)) if network.allow is not None else "",
        labels.NETWORK_DENY: json.dumps(list(network.deny)) if network.deny else "",
        labels.SECRET_HOSTS: json.dumps({k: list(v) for k, v in sorted(network.secret_hosts.items())})
        if network.secret_hosts
        else "",
    }


def egress_of(pool: Mapping[str, Any]) -> PoolEgress:
    """The `[network]` rules and secret hosts a pool's annotations give the sandboxes it serves
    (absent or "": none); InvalidArgumentError names a malformed annotation and the rule."""
    annotations = (pool.get("metadata") or {}).get("annotations") or {}
    allow = _json_of(annotations, labels.NETWORK_ALLOW, list)
    deny = _json_of(annotations, labels.NETWORK_DENY, list)
    hosts = _json_of(annotations, labels.SECRET_HOSTS, dict)
    for key, rules in ((labels.NETWORK_ALLOW, allow), (labels.NETWORK_DENY, deny)):
        if not all(isinstance(rule, str) for rule in rules or ()):
            raise InvalidArgumentError(f"annotation {key}", "must be a JSON list of rules (strings)")
        egress.parse_rules(rules or (), field=f"annotation {key}")
    secret_hosts: dict[str, tuple[str, ...]] = {}
    for name, entries in (hosts or {}).items():
        where = f"annotation {labels.SECRET_HOSTS}"
        if not isinstance(entries, list) or not entries or not all(isinstance(e, str) for e in entries):
            raise InvalidArgumentError(where, f"secret {name!r} must name a non-empty list of hosts (strings)")
        for index, entry in enumerate(entries):
            egress.parse_secret_host(entry, field=f"{where} {name}[{index}]")
        secret_hosts[name] = tuple(entries)
    return PoolEgress(tuple(allow) if allow is not None else None, tuple(deny or ()), secret_hosts)


def _json_of(annotations: Mapping[str, Any], key: str, kind: type[list[Any]] | type[dict[str, Any]]) -> Any:
    """An annotation's JSON value of `kind` (None when absent or "")."""
    text = annotations.get(key)
    if text is None or text == "":
        return None
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, kind):
        word = "list" if kind is list else "object"
        raise InvalidArgumentError(f"annotation {key}", f"must be a JSON {word}, got {text!r}")
    return value


def _accepted_annotation(shape: SandboxShape) -> dict[str, dict[str, str]]:
    """Pod-template metadata naming the accepted patterns (copied into every member's Sandbox, so
    a member's shape says what it accepts); nothing for a pool that accepts none."""
    if not shape.accepted:
        return {}
    return {"annotations": {labels.ACCEPTED_ENVIRONMENT: ",".join(shape.accepted)}}


def _accepted_of(pod_template: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The accepted patterns a pod template declares (None when malformed: not our shape)."""
    text = ((pod_template.get("metadata") or {}).get("annotations") or {}).get(labels.ACCEPTED_ENVIRONMENT) or ""
    patterns = [p for p in str(text).split(",") if p]
    try:
        validate_environment_patterns(patterns)
    except InvalidArgumentError:
        return None
    return pattern_set(patterns)


def shape_of_template(template: Mapping[str, Any]) -> SandboxShape | None:
    """The shape a template's pods actually run; None if it is not a warmshell supervisor template."""
    metadata = template.get("metadata") or {}
    workspace = (metadata.get("annotations") or {}).get(labels.WORKSPACE)
    pod_template = (template.get("spec") or {}).get("podTemplate") or {}
    pod = pod_template.get("spec") or {}
    accepted = _accepted_of(pod_template)
    containers = {c.get("name"): c for c in pod.get("containers") or []}
    container, workload = containers.get(rendering.CONTAINER), containers.get(rendering.WORKLOAD_CONTAINER)
    # Exactly the two containers (a one-container pod is the shape before the agent: not ours).
    if not workspace or accepted is None or container is None or workload is None or len(containers) != 2:
        return None
    if container.get("command") != ["warmshell"] or container.get("args") != ["supervisor"]:
        return None
    if workload.get("command") != list(rendering.AGENT_COMMAND):
        return None
    environment: dict[str, str] = {}
    for entry in container.get("env") or []:
        if entry.get("name") in rendering.RESERVED_ENV:
            continue
        if "value" not in entry or "valueFrom" in entry:
            return None  # a value we cannot know is a shape we cannot verify
        environment[entry["name"]] = entry["value"]
    requests = (workload.get("resources") or {}).get("requests") or {}
    try:  # read from the cluster: normalised here, like a request at the gateway's edge
        cpu = str(requests.get("cpu") or "")
        memory = str(requests.get("memory") or "")
        amounts = (cpu_millis(cpu) if cpu else 0, memory_bytes(memory) if memory else 0)
    except InvalidArgumentError:
        return None  # quantities that do not parse are not ours
    shape = SandboxShape(
        workspace=workspace,
        image=workload.get("image") or "",
        environment=environment,
        cpu_millis=amounts[0],
        memory_bytes=amounts[1],
        runtime_class_name=pod.get("runtimeClassName") or "",
        accepted=accepted,
    )
    if any(matches_any(key, accepted) for key in environment):
        return None  # a key is baked or accepted, never both (as profiles are parsed)
    return shape
