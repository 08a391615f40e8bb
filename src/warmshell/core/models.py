"""The sandbox as the gateway stores it: spec, status, conditions and timeline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from warmshell.core.errors import InvalidArgumentError
from warmshell.core.ids import SandboxId
from warmshell.core.quantities import cpu_millis, memory_bytes, render_cpu, render_memory
from warmshell.core.states import Allocation, Phase

__all__ = [
    "Allocation",
    "Condition",
    "Lifetime",
    "NetworkRequest",
    "Phase",
    "Resources",
    "SandboxRecord",
    "SandboxSpec",
    "SandboxStatus",
    "Storage",
    "Timeline",
    "now_ms",
    "now_us",
]

DEFAULT_WORKSPACE = "default"
# The workload's working directory inside every sandbox, on every driver (a writable directory
# the driver provides); the gateway sends it in each activation.
WORKSPACE_DIR = "/workspace"


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def now_us() -> int:
    """Wall-clock microseconds since the epoch (timelines resolve single milliseconds)."""
    return time.time_ns() // 1_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _without_empty(dumped: dict[str, Any], key: str) -> dict[str, Any]:
    """`dumped` without `key` while it is empty or false: a field added later is left out until
    set, since a replica of an older release sharing the store refuses a key it does not know."""
    if not dumped.get(key):
        dumped.pop(key, None)
    return dumped


class Condition(_Model):
    """Why a sandbox is in its phase (Kubernetes condition conventions)."""

    type: str
    status: str = "True"
    reason: str = ""
    message: str = ""
    last_transition_ms: int = Field(default_factory=now_ms)


class Timeline(_Model):
    """When each step on the way to Ready happened (unix microseconds; 0 = not yet)."""

    requested_us: int = 0
    backend_created_us: int = 0
    claimed_us: int = 0
    registered_us: int = 0
    activated_us: int = 0
    ready_us: int = 0
    exited_us: int = 0


class Resources(_Model):
    """Requested amounts in their normal units: whole millicores and bytes (0 = no request).

    Built from quantities (``Resources(cpu="0.5", memory="1024Mi")``) it normalises them, once:
    that is the create's edge (`core.specs`) or a record read back from the store. Everything
    after it — fingerprints, limits, pod specs — uses the amounts as they are; `cpu` and
    `memory` render their normal form ("500m", "1Gi"; "" = no request)."""

    cpu_millis: int = Field(default=0, ge=0)
    memory_bytes: int = Field(default=0, ge=0)
    pids: int = 0  # 0 = no request (the driver's default)

    @model_validator(mode="before")
    @classmethod
    def _from_quantities(cls, data: Any) -> Any:
        return _amounts(data, {"cpu": ("cpu_millis", cpu_millis), "memory": ("memory_bytes", memory_bytes)})

    @model_serializer(mode="wrap")
    def _as_quantities(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _quantities(
            handler(self), {"cpu_millis": ("cpu", render_cpu), "memory_bytes": ("memory", render_memory)}
        )

    @property
    def cpu(self) -> str:
        """The cpu request's normal form ("" = none)."""
        return render_cpu(self.cpu_millis)

    @property
    def memory(self) -> str:
        """The memory request's normal form ("" = none)."""
        return render_memory(self.memory_bytes)


class Storage(_Model):
    """Sizes of a sandbox's writable places in bytes, set by its pool's profile (0 = the driver's
    default); built from quantities (``Storage(workspace="2Gi")``) like `Resources`."""

    workspace_bytes: int = Field(default=0, ge=0)
    tmp_bytes: int = Field(default=0, ge=0)
    # The writable upper layer over an image's read-only layers (images of the image store only).
    root_bytes: int = Field(default=0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _from_quantities(cls, data: Any) -> Any:
        return _amounts(
            data,
            {
                "workspace": ("workspace_bytes", memory_bytes),
                "tmp": ("tmp_bytes", memory_bytes),
                "root": ("root_bytes", memory_bytes),
            },
        )

    @model_serializer(mode="wrap")
    def _as_quantities(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = _quantities(
            handler(self),
            {
                "workspace_bytes": ("workspace", render_memory),
                "tmp_bytes": ("tmp", render_memory),
                "root_bytes": ("root", render_memory),
            },
        )
        if not dumped.get("root"):  # left out unset: a replica of an older release refuses the key
            dumped.pop("root", None)
        return dumped

    @property
    def workspace(self) -> str:
        """The workspace size's normal form ("" = the default)."""
        return render_memory(self.workspace_bytes)

    @property
    def tmp(self) -> str:
        """The /tmp size's normal form ("" = the default)."""
        return render_memory(self.tmp_bytes)


def _amounts(data: Any, quantities: dict[str, tuple[str, Callable[..., int]]]) -> Any:
    """`data` with each quantity key ("cpu": "0.5") replaced by its amount ("cpu_millis": 500);
    an empty quantity is no request (0)."""
    if not isinstance(data, dict) or not any(key in data for key in quantities):
        return data
    data = dict(data)
    for key, (amount_key, parse) in quantities.items():
        if key in data:
            text = data.pop(key)
            if not isinstance(text, str):
                raise InvalidArgumentError(key, "must be a quantity string")
            data[amount_key] = parse(text, field=key) if text.strip() else 0
    return data


def _quantities(dumped: dict[str, Any], amounts: dict[str, tuple[str, Callable[[int], str]]]) -> dict[str, Any]:
    """`dumped` with each amount ("cpu_millis": 500) written back as its quantity ("cpu": "500m").

    Records are stored in the quantity form: replicas of an older release, still running during a
    rolling upgrade on one Postgres, read it, and `_amounts` reads it back here."""
    for amount_key, (key, render) in amounts.items():
        if amount_key in dumped:
            dumped[key] = render(dumped.pop(amount_key))
    return dumped


class NetworkRequest(_Model):
    """A request's egress rules (see core/egress): `allow` empty leaves its profile's as they are."""

    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)


class SandboxSpec(_Model):
    """What was asked for, after validation and normalisation."""

    image: str = ""
    environment: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    command: list[str] = Field(default_factory=list)
    runtime_class_name: str = ""
    # Names only: the values are sealed apart from the record (see gateway.secretvault).
    secret_names: list[str] = Field(default_factory=list)
    # Never part of a request (so never part of a match): a warm member has its pool's.
    storage: Storage = Field(default_factory=Storage)
    # Applied at activation, outside the sandbox: never part of a match (a warm member serves any).
    network: NetworkRequest = Field(default_factory=NetworkRequest)
    # Secret name -> the hosts it is for (the workload gets a placeholder for it; see core/egress).
    secret_hosts: dict[str, list[str]] = Field(default_factory=dict)
    # No workload even where the image has an Entrypoint/Cmd: the agent alone, for exec.
    no_command: bool = False

    @model_serializer(mode="wrap")
    def _without_unset_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_empty(handler(self), "no_command")


class SandboxStatus(_Model):
    """What the gateway knows about a sandbox now."""

    phase: Phase = Phase.PROVISIONING
    conditions: list[Condition] = Field(default_factory=list)
    allocation: Allocation = Allocation.COLD
    pool: str = ""
    exit_code: int | None = None
    timeline: Timeline = Field(default_factory=Timeline)
    instance_id: str = ""
    # Environment keys the serving pool accepted (left out of the match, set at activation).
    injected_environment: list[str] = Field(default_factory=list)
    # Inputs of phase composition (see warmshell.core.phases): what the backend reports and
    # whether the supervisor holds a live session.
    backend_state: str = ""
    supervisor_connected: bool = False
    # The live session (globally unique) and the gateway replica holding it: calls that need the
    # session are forwarded there; a close from another replica's older session changes nothing.
    session_id: str = ""
    session_owner: str = ""
    backend_seen_ms: int = 0
    # The supervisor incarnation (see drivers.base.SupervisorIdentity) last activated, and the one
    # that last opened a session; -1 for none. Only a later incarnation is activated again.
    activated_incarnation: int = -1
    connected_incarnation: int = -1
    # While Paused: the image holding its files, and what its lifetime was (see core.pausing).
    paused_image: str = ""
    paused_ttl_left_ms: int = 0
    paused_idle_timeout_seconds: int = 0
    # Instances that ran it before a pause (see core.pausing.is_retired).
    retired_instances: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _without_unset_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_empty(handler(self), "retired_instances")

    def condition(self, type_: str) -> Condition | None:
        """The condition of that type, if any."""
        return next((c for c in self.conditions if c.type == type_), None)

    def set_condition(self, condition: Condition) -> None:
        """Add or replace the condition of the same type (transition time kept when unchanged)."""
        for index, existing in enumerate(self.conditions):
            if existing.type == condition.type:
                if (existing.status, existing.reason, existing.message) == (
                    condition.status,
                    condition.reason,
                    condition.message,
                ):
                    return
                self.conditions[index] = condition
                return
        self.conditions.append(condition)


class Lifetime(_Model):
    """When the gateway deletes a sandbox: at `expires_at_ms` (0 = never), or once
    `idle_timeout_seconds` (0 = never) pass without exec activity after `last_activity_ms`."""

    ttl_seconds: int = 0
    expires_at_ms: int = 0
    idle_timeout_seconds: int = 0
    last_activity_ms: int = 0


class SandboxRecord(_Model):
    """The stored sandbox. `activation_proof_hash` never leaves the gateway."""

    id: SandboxId
    name: str
    workspace: str = DEFAULT_WORKSPACE
    labels: dict[str, str] = Field(default_factory=dict)
    created_at_ms: int = Field(default_factory=now_ms)
    resource_version: int = 0
    spec: SandboxSpec = Field(default_factory=SandboxSpec)
    status: SandboxStatus = Field(default_factory=SandboxStatus)
    lifetime: Lifetime = Field(default_factory=Lifetime)
    activation_proof_hash: str = ""
