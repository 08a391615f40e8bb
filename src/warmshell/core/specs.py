"""Turning what a user asked for into a validated, normalised SandboxSpec."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from warmshell.core import validation
from warmshell.core.models import Resources, SandboxSpec
from warmshell.core.quantities import normalize_cpu, normalize_memory

__all__ = ["build_spec"]


def build_spec(
    *,
    image: str,
    environment: Mapping[str, str],
    cpu: str,
    memory: str,
    command: Sequence[str],
    runtime_class_name: str = "",
) -> SandboxSpec:
    """Validate every field (errors name it, e.g. ``spec.resources.cpu``) and normalise quantities."""
    validation.validate_image(image, field="spec.image")
    validation.validate_environment(environment, field="spec.environment")
    validation.validate_command(command, field="spec.command")
    if runtime_class_name:
        validation.validate_name(runtime_class_name, field="spec.runtime_class_name")
    return SandboxSpec(
        image=image,
        environment=dict(environment),
        resources=Resources(
            cpu=normalize_cpu(cpu, field="spec.resources.cpu"),
            memory=normalize_memory(memory, field="spec.resources.memory"),
        ),
        command=list(command),
        runtime_class_name=runtime_class_name,
    )
