"""The one fingerprint of a sandbox shape, shared by profiles, pool caches and create requests.

Two shapes that mean the same sandbox get the same fingerprint: a shape carries amounts (whole
millicores and bytes, normalised where the request or profile was read, so ``0.2`` and ``200m``
are both 200), the default image is resolved by the caller before hashing, and environment order
does not matter.

A pool may accept some environment keys at activation (`[activation] environment` patterns): its
shape carries the pattern set, and a request is compared with it after `accepting` those keys —
they leave the request's shape and are set when the sandbox is activated instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase

from warmshell.core.ids import Fingerprint
from warmshell.core.models import SandboxSpec
from warmshell.core.quantities import render_cpu, render_memory

__all__ = ["SandboxShape", "accepting", "canonical_json", "fingerprint", "matches_any", "pattern_set", "shape_of"]

FINGERPRINT_VERSION = 1


@dataclass(frozen=True)
class SandboxShape:
    """Everything that makes two sandboxes interchangeable before activation."""

    workspace: str
    image: str
    environment: Mapping[str, str] = field(default_factory=dict)
    cpu_millis: int = 0  # 0 = no request
    memory_bytes: int = 0
    pids: int = 0
    runtime_class_name: str = ""
    # The environment patterns the pool accepts at activation (a `pattern_set`); () for a request.
    accepted: tuple[str, ...] = ()


def pattern_set(patterns: Iterable[str]) -> tuple[str, ...]:
    """The canonical form of a set of accepted-environment patterns (sorted, no repeats)."""
    return tuple(sorted(set(patterns)))


def matches_any(key: str, patterns: Iterable[str]) -> bool:
    """Whether an environment key matches one of the shell-style patterns (case-sensitive)."""
    return any(fnmatchcase(key, pattern) for pattern in patterns)


def accepting(shape: SandboxShape, patterns: tuple[str, ...]) -> tuple[SandboxShape, tuple[str, ...]]:
    """A request's shape as a pool accepting `patterns` (a `pattern_set`) compares it: without
    the keys those patterns match, which are returned (sorted) to be set at activation."""
    if not patterns:
        return shape, ()
    injected = tuple(sorted(k for k in shape.environment if matches_any(k, patterns)))
    kept = {k: v for k, v in shape.environment.items() if k not in injected}
    return replace(shape, environment=kept, accepted=patterns), injected


def shape_of(workspace: str, spec: SandboxSpec, *, default_image: str) -> SandboxShape:
    """The shape a create request asks for, with the driver's default image resolved."""
    return SandboxShape(
        workspace=workspace,
        image=spec.image or default_image,
        environment=spec.environment,
        cpu_millis=spec.resources.cpu_millis,
        memory_bytes=spec.resources.memory_bytes,
        pids=spec.resources.pids,
        runtime_class_name=spec.runtime_class_name,
    )


def canonical_json(shape: SandboxShape) -> str:
    """Sorted-key, whitespace-free JSON of the shape (amounts in their normal form, as fingerprints
    have always hashed them)."""
    document = {
        "v": FINGERPRINT_VERSION,
        "workspace": shape.workspace,
        "image": shape.image,
        "environment": dict(sorted(shape.environment.items())),
        "resources": {"cpu": render_cpu(shape.cpu_millis), "memory": render_memory(shape.memory_bytes)},
        "runtimeClassName": shape.runtime_class_name,
    }
    if shape.pids:  # absent when 0, so shapes without a process count keep their fingerprints
        document["pids"] = shape.pids
    if shape.accepted:  # absent when empty, so pools accepting nothing keep their fingerprints
        document["accepts"] = list(pattern_set(shape.accepted))
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(shape: SandboxShape) -> Fingerprint:
    """SHA-256 hex of the canonical JSON of the shape."""
    return Fingerprint(hashlib.sha256(canonical_json(shape).encode()).hexdigest())
