"""Which gateway replica leads, for the Kubernetes driver: one Lease (`lease.Elector`) elects the
replica that runs the profile reconciler (`reconciler`) and the gateway's singletons
(`drivers.base.Leadership`), while every replica serves requests.

The driver starts the reconciler on the Lease when profiles are configured (`run_profiles`) or
campaigns for the singletons alone (`campaign`), asks `leading()`, and lists the invalid profile
ConfigMaps the reconciler reports while this replica leads (`invalid_profiles`).
"""

from __future__ import annotations

import asyncio
import contextlib

from warmshell.core.config import KubernetesDriverConfig
from warmshell.drivers.base import PoolView, invalid_profile_view
from warmshell.drivers.kubernetes import kube
from warmshell.drivers.kubernetes.profiles import lease, reconciler
from warmshell.drivers.kubernetes.warm.extensions import ExtensionsGate

__all__ = ["Leadership"]


class Leadership:
    """The Lease this replica campaigns on and the one task that holds it."""

    def __init__(self, api: kube.Kube, config: KubernetesDriverConfig) -> None:
        self._api = api
        self._config = config
        self._task: asyncio.Task[None] | None = None  # the profile reconciler, or the bare campaign
        self._elector = lease.elector_for(api, config)  # one Lease for every singleton (see campaign)
        self._problems: dict[str, str] = {}  # invalid profile ConfigMaps, while leading

    def run_profiles(self, gate: ExtensionsGate) -> None:
        """Run the profile reconciler on the Lease, once. It runs even while the extension APIs
        are absent: it waits on the same gate as the warm path."""
        if self._task is None:
            self._task = asyncio.create_task(
                reconciler.run_elected(
                    self._api, self._config, gate=gate, on_problems=self._set_problems, elector=self._elector
                ),
                name="k8s-profiles",
            )

    def campaign(self) -> None:
        """Hold the Lease for the gateway's singletons; without profiles, for them alone."""
        if self._task is None:
            self._task = asyncio.create_task(self._elector.run(_hold), name="k8s-lease")

    def leading(self) -> bool:
        """Whether this replica holds the Lease now."""
        return self._elector.is_leader

    def invalid_profiles(self) -> list[PoolView]:
        """Invalid profiles have no pool: listed by their ConfigMap (known on the profile leader)."""
        namespace = self._config.namespace
        return [
            invalid_profile_view(name, source=f"configmap {namespace}/{name}", message=error)
            for name, error in sorted(self._problems.items())
        ]

    async def aclose(self) -> None:
        """Stop the task, which releases the Lease: another replica takes over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _set_problems(self, problems: dict[str, str]) -> None:
        self._problems = problems


async def _hold() -> None:
    """The Lease's work when only the gateway's singletons need it: they ask `leading()`."""
    await asyncio.Event().wait()
