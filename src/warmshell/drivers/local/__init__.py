"""The local compute driver: sandboxes as supervisor processes under bubblewrap, warm pools from
`warm-pool.toml` profiles."""

from warmshell.drivers.local.driver import LocalDriver

__all__ = ["LocalDriver"]
