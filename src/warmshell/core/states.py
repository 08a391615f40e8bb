"""The words a sandbox's state is told in: its Phase and how it was allocated.

Plain enums in a module of their own (re-exported by `warmshell.core.models`) so that the SDK's
views, and through them the CLI, can name them without importing pydantic.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Allocation", "Phase"]


class Phase(StrEnum):
    """PROVISIONING -> READY -> (EXITED | ERROR | DELETING); EXITED and ERROR are sticky.

    EXITED: the workload ran and ended (its exit code says how), which is how a one-shot sandbox
    finishes; ERROR: the sandbox itself broke (backend failed or vanished, supervisor lost).
    """

    PROVISIONING = "Provisioning"
    READY = "Ready"
    EXITED = "Exited"
    ERROR = "Error"
    DELETING = "Deleting"
    # Its files kept as an image, nothing running; resumed by a new backend (see core.pausing).
    PAUSED = "Paused"


class Allocation(StrEnum):
    """How a sandbox was obtained."""

    COLD = "cold"
    WARM = "warm"
