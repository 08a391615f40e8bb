"""Whether the cluster serves agent-sandbox's extension APIs (SandboxTemplate, SandboxWarmPool,
SandboxClaim). Warm pooling needs them; without them it is off — said once, in one warning — and
comes back on by itself once they are installed, found by a probe with backoff.

The driver's warm path (`warm.WarmAllocation`) owns the one gate and shares it with everything
that needs the APIs (claim allocation, the profile reconciler), so a gateway says each transition
once, however many parts wait on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from warmshell.drivers.kubernetes import kube
from warmshell.drivers.kubernetes.clock import Clock, SystemClock

__all__ = ["ExtensionsGate", "ProbeApi"]

log = logging.getLogger(__name__)

# Between probes while the APIs are absent: quick at first (an operator installing them now),
# then once a minute.
PROBE_DELAYS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_RESOURCES = (kube.SANDBOX_WARM_POOLS, kube.SANDBOX_TEMPLATES, kube.SANDBOX_CLAIMS)


class ProbeApi(Protocol):
    """The one call the probe makes (`kube.Kube`)."""

    async def list(self, resource: kube.Resource, namespace: str, *, limit: int = 0) -> dict[str, Any]: ...


class ExtensionsGate:
    """Tracks availability; `available` is None until the first probe answered."""

    def __init__(
        self,
        api: ProbeApi,
        namespace: str,
        *,
        clock: Clock | None = None,
        delays: Sequence[float] | None = None,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._clock = clock or SystemClock()
        self._delays = tuple(delays or PROBE_DELAYS) or (1.0,)  # read late: tests shorten it
        self._probing = asyncio.Lock()  # one probe loop, however many parts wait
        self._gone = asyncio.Event()  # set while the APIs are known to be absent
        self.available: bool | None = None

    async def probe(self) -> bool:
        """One look: does the cluster serve all three? (Temporary failures propagate.) All three,
        because a half-installed group would turn on, fail on the missing one and turn off again."""
        try:
            for resource in _RESOURCES:
                await self._api.list(resource, self._namespace, limit=1)
        except kube.NotFound:
            self._set(False)
            return False
        self._set(True)
        return True

    async def wait_available(self) -> None:
        """Return once the extension APIs are served (at once if they are known to be); probe
        with backoff meanwhile."""
        async with self._probing:
            attempt, warned = 0, False
            while self.available is not True:
                try:
                    if await self.probe():
                        return
                except kube.Temporary as exc:
                    log.debug("probe of %s: %s", kube.EXTENSIONS_GROUP, exc)
                except kube.ApiError as exc:
                    # A 403 after an RBAC change, say: someone may fix it, so keep probing; say it once.
                    if not warned:
                        log.warning("probe of %s failed (%s); retrying", kube.EXTENSIONS_GROUP, exc)
                        warned = True
                await self._clock.sleep(self._delays[min(attempt, len(self._delays) - 1)])
                attempt += 1

    async def wait_lost(self) -> None:
        """Return once the APIs are known to be absent (a probe, or a call that called `lost`)."""
        await self._gone.wait()

    def lost(self) -> None:
        """A call found the APIs gone (404 on the collection): off again until a probe finds them."""
        self._set(False)

    def _set(self, available: bool) -> None:
        if available == self.available:
            return
        if available:
            self._gone.clear()
            if self.available is False:
                log.info(
                    "agent-sandbox extension APIs (%s) are installed now: warm pooling is on", kube.EXTENSIONS_GROUP
                )
        else:
            self._gone.set()
            log.warning(
                "agent-sandbox extension APIs (%s: SandboxTemplate, SandboxWarmPool, SandboxClaim) are not installed: "
                "warm pooling is off (sandboxes start cold) until they appear; install agent-sandbox's extensions.yaml",
                kube.EXTENSIONS_GROUP,
            )
        self.available = available
