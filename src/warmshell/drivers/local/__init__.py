"""The local compute driver: sandboxes as bubblewrap + a C agent as pid 1, their supervisors
host-side in the gateway, warm pools from `warm-pool.toml` profiles.

`LocalDriver` is loaded on first use: `warmshell install-agent` (the init container of pods an
older gateway rendered) imports a module of this package to find the agent binary, and importing the driver with it cost
that container about 0.35 s of CPU, per pod start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warmshell.drivers.local.driver import LocalDriver

__all__ = ["LocalDriver"]


def __getattr__(name: str) -> Any:
    if name == "LocalDriver":
        from warmshell.drivers.local.driver import LocalDriver

        return LocalDriver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
