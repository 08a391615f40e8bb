"""What the local driver accepts: the local meaning of a create's spec (checked before anything
is made) and of a pool profile (checked when profiles are loaded, so an invalid one is reported
on its pool instead of failing every refill)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError
from warmshell.core.models import SandboxSpec
from warmshell.core.profiles import Profile, ProfileError
from warmshell.drivers.local.hostsetup import HostSetup
from warmshell.drivers.local.runtime import cgroups, imageroots, images, limits

__all__ = [
    "check_image_root",
    "check_profile",
    "check_spec",
    "stored_images_refused",
    "unenforceable",
    "userns_overlay_refused",
]


def check_spec(spec: SandboxSpec, host: HostSetup) -> SandboxSpec:
    """The spec as this driver runs it: an image of the image store pinned to its digest (see
    `imageroots`). The image is "", an image of the store (InvalidArgumentError saying how to
    import it when unknown; FailedPreconditionError when this gateway cannot run one), or an
    unpacked root filesystem directory under one of the image roots; there are no runtime
    classes, and nothing asked for is over the gateway's maximums (InvalidArgumentError naming
    the field) or beyond what this host can enforce (FailedPreconditionError naming the field;
    see `unenforceable`)."""
    if imageroots.is_reference(spec.image) and (why := stored_images_refused(host)) is not None:
        raise FailedPreconditionError(f"spec.image: {why}")
    spec = _check_arguments(spec, host)
    refused = unenforceable(spec, host)
    if refused is not None:
        raise FailedPreconditionError(": ".join(refused))
    return spec


def stored_images_refused(host: HostSetup) -> str | None:
    """Why this gateway cannot run images of its image store (None: it can)."""
    if not host.launcher.isolated:
        return "images of the image store need bubblewrap (local.allow_unisolated runs the host's root only)"
    if host.launcher.images is None:
        return "this gateway has no image store"
    if not host.root and (why := userns_overlay_refused(os.uname().release)) is not None:
        return why
    return None


def userns_overlay_refused(release: str) -> str | None:
    """Why a gateway of a normal user cannot mount an image's overlay on a kernel of this
    release (None: it can). Its launcher mounts the overlay in a user namespace of its own,
    which overlayfs allows from Linux 5.11 (with `userxattr`, the whiteouts the store writes)."""
    numbers = [int(part) if part.isdigit() else 0 for part in release.split("-")[0].split(".")[:2]]
    if tuple(numbers) >= (5, 11):
        return None
    return (
        f"images of the image store need Linux 5.11 or later for a gateway not run as root "
        f"(overlayfs in a user namespace); this kernel is {release}: run the gateway as root"
    )


def _check_arguments(spec: SandboxSpec, host: HostSetup) -> SandboxSpec:
    if spec.runtime_class_name:
        raise InvalidArgumentError("spec.runtime_class_name", "must be empty on the local driver (no runtime classes)")
    if imageroots.is_reference(spec.image) and host.launcher.images is not None:
        pinned = host.launcher.images.pin(spec.image)
        if pinned != spec.image:  # a spec validated before (the driver's create) is kept as it is
            spec = spec.model_copy(update={"image": pinned})
        if not spec.command and not spec.no_command:
            # Recorded as the spec's command, so `sandbox get` shows what runs; the workload
            # starts at activation, so a warm member (started before any request) runs it too.
            command = imageroots.default_command(host.launcher.images.config(pinned))
            spec = spec.model_copy(update={"command": command})
    elif spec.image:
        check_image_root(spec.image, host.image_roots)
        images.check_image(spec.image)
    limits.check_maximum(spec, host.maximums)
    return spec


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


def check_profile(profile: Profile, host: HostSetup) -> Profile:
    """`check_spec` of what the profile's members run, and the profile as they run it (its
    image pinned); a ProfileError naming its key (reason `ImageNotFound` for an image the store
    does not have)."""
    if imageroots.is_reference(profile.image) and (why := stored_images_refused(host)) is not None:
        raise ProfileError(profile.source, "image", why)
    spec = SandboxSpec(
        image=profile.image,
        runtime_class_name=profile.runtime_class_name,
        resources=profile.resources,
        storage=profile.storage,
    )
    try:
        spec = _check_arguments(spec, host)
    except InvalidArgumentError as exc:
        key = exc.field.removeprefix("spec.")
        reason = imageroots.NOT_FOUND if isinstance(exc, imageroots.ImageNotFoundError) else ""
        raise ProfileError(profile.source, key, exc.rule, reason=reason) from exc
    refused = unenforceable(spec, host)
    if refused is not None:
        raise ProfileError(profile.source, refused[0].removeprefix("spec."), refused[1])
    return dataclasses.replace(profile, image=spec.image)
