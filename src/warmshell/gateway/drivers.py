"""Choosing and constructing the compute driver named in the config."""

from __future__ import annotations

from warmshell.core.config import GatewayConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.base import ComputeDriver

__all__ = ["build_driver"]


def build_driver(config: GatewayConfig, *, gateway_id: str) -> ComputeDriver:
    """The driver for `config.driver` (imported lazily: each pulls in its own dependencies);
    `gateway_id` names this gateway on the objects a driver writes."""
    if config.driver == "local":
        from warmshell.drivers.local import LocalDriver
        from warmshell.gateway.setupbuilds import client_build

        return LocalDriver(config.local, config.paths, build=client_build(config.state_dir))
    if config.driver == "kubernetes":
        from warmshell.drivers.kubernetes import KubernetesDriver

        return KubernetesDriver(config.kubernetes, config.paths, gateway_id=gateway_id)
    raise InvalidArgumentError("driver", f"driver {config.driver!r} is not available in this build")
