"""What the local driver accepts: the local meaning of a create's spec (checked before anything
is made) and of a pool profile (checked when profiles are loaded, so an invalid one is reported
on its pool instead of failing every refill)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError
from warmshell.core.models import SandboxSpec
from warmshell.core.profiles import Profile, ProfileError
from warmshell.drivers.local.hostsetup import HostSetup
from warmshell.drivers.local.runtime import cgroups, images, limits

__all__ = ["check_image_root", "check_profile", "check_spec", "unenforceable"]


def check_spec(spec: SandboxSpec, host: HostSetup) -> None:
    """The image is "" or an unpacked root filesystem directory under one of the image roots,
    there are no runtime classes, and nothing asked for is over the gateway's maximums
    (InvalidArgumentError naming the field) or beyond what this host can enforce
    (FailedPreconditionError naming the field; see `unenforceable`)."""
    _check_arguments(spec, host)
    refused = unenforceable(spec, host)
    if refused is not None:
        raise FailedPreconditionError(": ".join(refused))


def _check_arguments(spec: SandboxSpec, host: HostSetup) -> None:
    if spec.runtime_class_name:
        raise InvalidArgumentError("spec.runtime_class_name", "must be empty on the local driver (no runtime classes)")
    if spec.image:
        check_image_root(spec.image, host.image_roots)
    images.check_image(spec.image)
    limits.check_maximum(spec, host.maximums)


def unenforceable(spec: SandboxSpec, host: HostSetup) -> tuple[str, str] | None:
    """The field and the reason when the spec asks explicitly for cpu, memory or pids this host
    cannot enforce: refused, never silently ignored, unless `local.allow_unenforced_limits`
    (the configured defaults stay best-effort)."""
    field = None if host.allow_unenforced_limits else limits.unenforced_field(spec, host.enforceable)
    if field is None:
        return None
    if not host.launcher.isolated:
        why = " (local.allow_unisolated: no bounds at all)"
    else:
        why = f" ({host.cgroup.message})" if isinstance(host.cgroup, cgroups.Unavailable) else ""
    rule = f"this host cannot enforce it{why}; set local.allow_unenforced_limits = true to run such sandboxes unbounded"
    return field, rule


def check_image_root(image: str, roots: Sequence[Path], *, field: str = "spec.image") -> None:
    """Raise InvalidArgumentError unless `image`, symlinks followed, is a directory below one of
    `roots` (resolved). First, and with the same answer for a path that exists and one that does
    not, so a caller cannot probe the host's directories through the image's errors."""
    if not roots:
        raise InvalidArgumentError(
            field, f'{image!r}: this gateway allows no image root filesystems (local.image_roots is empty); use ""'
        )
    target = Path(os.path.realpath(image)) if os.path.isabs(image) else None
    if target is None or not any(root in target.parents for root in roots):
        allowed = ", ".join(repr(str(root)) for root in roots)
        raise InvalidArgumentError(
            field, f'{image!r}: an image is "" or a root filesystem directory below local.image_roots ({allowed})'
        )


def check_profile(profile: Profile, host: HostSetup) -> None:
    """`check_spec` of what the profile's members run; a ProfileError naming its key."""
    spec = SandboxSpec(
        image=profile.image,
        runtime_class_name=profile.runtime_class_name,
        resources=profile.resources,
        storage=profile.storage,
    )
    try:
        _check_arguments(spec, host)
    except InvalidArgumentError as exc:
        key = exc.field.removeprefix("spec.")
        raise ProfileError(profile.source, key, exc.rule) from exc
    refused = unenforceable(spec, host)
    if refused is not None:
        raise ProfileError(profile.source, refused[0].removeprefix("spec."), refused[1])
