"""Pool members as the local pools start and stop them: `PoolSet` asks for a member of a pool,
and this makes a fresh instance of the pool's shape and has the fleet launch it at the refills'
CPU priority. The pools module gets it injected (`pooling.Members`), so it never calls back into
the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from warmshell.drivers.local.fleet import Fleet
from warmshell.drivers.local.instances import Instance
from warmshell.drivers.local.pools.pooling import Pool

__all__ = ["FleetMembers"]


@dataclass(frozen=True)
class FleetMembers:
    """`pooling.Members` over the driver's fleet."""

    fleet: Fleet
    sandboxes: Path  # where instance directories live (`StatePaths.sandboxes`)
    nice: int  # refills start at this nice value (`local.refill_nice`)

    async def spawn(self, pool: Pool) -> Instance:
        """Launch a new idle member of `pool` (UnavailableError when its sandbox cannot start)."""
        member = Instance.member(pool.profile.workspace, pool.fingerprint, pool.name, sandboxes=self.sandboxes)
        await self.fleet.launch(member, pool.spec, nice=self.nice)
        return member

    async def stop(self, member: Instance) -> None:
        """Stop the member and remove its files."""
        await self.fleet.stop(member)
