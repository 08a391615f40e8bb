"""The local compute driver: sandboxes as bubblewrap + a C agent as pid 1, their supervisors
host-side in the gateway, warm pools from `warm-pool.toml` profiles."""

from warmshell.drivers.local.driver import LocalDriver

__all__ = ["LocalDriver"]
