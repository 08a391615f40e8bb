"""What an image means on the local driver.

`""` (the default) is the host's root filesystem, read-only. An absolute path must be a directory
holding an unpacked root filesystem (for example made with debootstrap, or `docker export` of a
container, extracted); it is bound read-only as `/`, entry by entry (see
`sandboxing.image_root_plan`). Anything else names an image of the image store (see
`imageroots`). Nothing of warmshell but the static agent enters either: the supervisor runs
host-side, so an image needs no Python.
"""

from __future__ import annotations

from pathlib import Path

from warmshell.core.errors import InvalidArgumentError

__all__ = ["check_image"]

_RULE = (
    'on the local driver an image is "" (the host root filesystem, read-only) or the '
    "absolute path of an unpacked root filesystem directory"
)


def check_image(image: str, *, field: str = "spec.image") -> None:
    """Raise InvalidArgumentError unless `image` is usable as a local root filesystem (blocking:
    two stat calls)."""
    if not image:
        return
    path = Path(image)
    if not path.is_absolute():
        raise InvalidArgumentError(field, f"{image!r}: {_RULE}")
    if not (path / "usr").is_dir():
        raise InvalidArgumentError(field, f"{image!r} is not a directory with a usr/: {_RULE}")
    if path.resolve() == Path("/"):
        # Bound whole, the host's root would undo the allow-list of host paths (homes, /var,
        # every world-readable file; a gateway's state directory where the sandbox shares its uid).
        raise InvalidArgumentError(field, f'{image!r} is the host root filesystem: use "" for it; {_RULE}')
