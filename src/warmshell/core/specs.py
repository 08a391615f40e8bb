"""Turning what a user asked for into the core model of a create: a validated `NewSandbox` whose
`SandboxSpec` carries its quantities as amounts (millicores, bytes), normalised here and nowhere
after. The gateway builds it once, at its edge, from the public request; the manager persists it
and hands its spec to the driver unchanged."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from warmshell.core import egress, validation
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import DEFAULT_WORKSPACE, NetworkRequest, Resources, SandboxSpec
from warmshell.core.quantities import cpu_millis, memory_bytes

__all__ = ["NewSandbox", "build_spec", "new_sandbox"]


@dataclass(frozen=True)
class NewSandbox:
    """A create request, validated: `name` "" means the gateway picks one."""

    workspace: str
    name: str
    spec: SandboxSpec
    labels: Mapping[str, str] = field(default_factory=dict)
    # Secret values stay out of `spec` (which is stored and shown); the spec keeps their names.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    # Lifetime the request asked for; None = the default (warmshell.core.lifetimes), 0 = none.
    ttl_seconds: int | None = None
    idle_timeout_seconds: int | None = None


def new_sandbox(
    *,
    workspace: str,
    name: str,
    labels: Mapping[str, str],
    spec: Callable[[], SandboxSpec],
    secrets: Mapping[str, str] | None = None,
    ttl_seconds: int | None = None,
    idle_timeout_seconds: int | None = None,
    secret_hosts: Mapping[str, Sequence[str]] | None = None,
) -> NewSandbox:
    """Validate the request — workspace (the default when empty), name, labels, then the spec
    (`spec`, e.g. a `build_spec` call, runs last so errors come in that order; each names its
    field), then `secrets` (``spec.secrets``), whose names the spec records."""
    workspace = workspace or DEFAULT_WORKSPACE
    validation.validate_workspace(workspace)
    if name:
        validation.validate_name(name)
    validation.validate_labels(labels)
    built = spec()
    secrets = dict(secrets or {})
    validation.validate_secrets(secrets, built.environment, field="spec.secrets")
    built.secret_names = sorted(secrets)
    built.secret_hosts = egress.secret_hosts(secret_hosts or {}, secrets, field="spec.secret_hosts")
    return NewSandbox(
        workspace=workspace,
        name=name,
        spec=built,
        labels=dict(labels),
        secrets=secrets,
        ttl_seconds=ttl_seconds,
        idle_timeout_seconds=idle_timeout_seconds,
    )


def build_spec(
    *,
    image: str,
    environment: Mapping[str, str],
    cpu: str,
    memory: str,
    command: Sequence[str],
    runtime_class_name: str = "",
    pids: int = 0,
    network_allow: Sequence[str] = (),
    network_deny: Sequence[str] = (),
    no_command: bool = False,
) -> SandboxSpec:
    """Validate every field (errors name it, e.g. ``spec.resources.cpu``) and normalise quantities."""
    validation.validate_image(image, field="spec.image")
    validation.validate_environment(environment, field="spec.environment")
    validation.validate_command(command, field="spec.command")
    if no_command and command:
        raise InvalidArgumentError("spec.no_command", "cannot be set together with spec.command (it asks for none)")
    if runtime_class_name:
        validation.validate_name(runtime_class_name, field="spec.runtime_class_name")
    egress.parse_rules(network_allow, field="spec.network.allow")
    egress.parse_rules(network_deny, field="spec.network.deny")
    resources = Resources(
        cpu_millis=cpu_millis(cpu, field="spec.resources.cpu") if cpu.strip() else 0,
        memory_bytes=memory_bytes(memory, field="spec.resources.memory") if memory.strip() else 0,
        pids=pids,
    )
    # The error quotes what the user wrote.
    validation.validate_resources(resources.cpu_millis, resources.memory_bytes, pids, typed=(cpu, memory))
    return SandboxSpec(
        image=image,
        environment=dict(environment),
        resources=resources,
        command=list(command),
        runtime_class_name=runtime_class_name,
        network=NetworkRequest(
            allow=[rule.strip() for rule in network_allow], deny=[rule.strip() for rule in network_deny]
        ),
        no_command=no_command,
    )
