"""What the local driver accepts: the local meaning of a create's spec (checked before anything
is made) and of a pool profile (checked when profiles are loaded, so an invalid one is reported
on its pool instead of failing every refill)."""

from __future__ import annotations

from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import SandboxSpec
from warmshell.core.profiles import Profile, ProfileError
from warmshell.drivers.local import images, limits
from warmshell.drivers.local.hostsetup import HostSetup

__all__ = ["check_profile", "check_spec"]


def check_spec(spec: SandboxSpec, host: HostSetup) -> None:
    """The image is "" or an unpacked root filesystem directory, there are no runtime classes,
    and nothing asked for is over the gateway's maximums (InvalidArgumentError naming the field)."""
    if spec.runtime_class_name:
        raise InvalidArgumentError("spec.runtime_class_name", "must be empty on the local driver (no runtime classes)")
    images.check_image(spec.image)
    limits.check_maximum(spec, host.maximums)


def check_profile(profile: Profile, host: HostSetup) -> None:
    """`check_spec` of what the profile's members run; a ProfileError naming its key."""
    spec = SandboxSpec(
        image=profile.image,
        runtime_class_name=profile.runtime_class_name,
        resources=profile.resources,
        storage=profile.storage,
    )
    try:
        check_spec(spec, host)
    except InvalidArgumentError as exc:
        key = exc.field.removeprefix("spec.")
        raise ProfileError(profile.source, key, exc.rule) from exc
