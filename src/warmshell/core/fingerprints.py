"""The one fingerprint of a sandbox shape, shared by profiles, pool caches and create requests.

Two shapes that mean the same sandbox get the same fingerprint: quantities are normalised
(``0.2`` == ``200m``, ``1Gi`` == ``1024Mi``), the default image is resolved by the caller before
hashing, and environment order does not matter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from warmshell.core.ids import Fingerprint
from warmshell.core.models import SandboxSpec
from warmshell.core.quantities import normalize_cpu, normalize_memory

__all__ = ["SandboxShape", "canonical_json", "fingerprint", "shape_of"]

FINGERPRINT_VERSION = 1


@dataclass(frozen=True)
class SandboxShape:
    """Everything that makes two sandboxes interchangeable before activation."""

    workspace: str
    image: str
    environment: Mapping[str, str] = field(default_factory=dict)
    cpu: str = ""
    memory: str = ""
    runtime_class_name: str = ""


def shape_of(workspace: str, spec: SandboxSpec, *, default_image: str) -> SandboxShape:
    """The shape a create request asks for, with the driver's default image resolved."""
    return SandboxShape(
        workspace=workspace,
        image=spec.image or default_image,
        environment=spec.environment,
        cpu=spec.resources.cpu,
        memory=spec.resources.memory,
        runtime_class_name=spec.runtime_class_name,
    )


def canonical_json(shape: SandboxShape) -> str:
    """Sorted-key, whitespace-free JSON of the normalised shape."""
    document = {
        "v": FINGERPRINT_VERSION,
        "workspace": shape.workspace,
        "image": shape.image,
        "environment": dict(sorted(shape.environment.items())),
        "resources": {"cpu": normalize_cpu(shape.cpu), "memory": normalize_memory(shape.memory)},
        "runtimeClassName": shape.runtime_class_name,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(shape: SandboxShape) -> Fingerprint:
    """SHA-256 hex of the canonical JSON of the shape."""
    return Fingerprint(hashlib.sha256(canonical_json(shape).encode()).hexdigest())
