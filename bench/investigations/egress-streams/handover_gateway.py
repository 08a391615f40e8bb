"""`python -m warmshell ...` where, while switched on (SIGUSR1 on, SIGUSR2 off), a create's
secrets are handed to its own activation in memory instead of read back from the vault: what
the in-memory hand-over part 5 weighs would save (sealed and written as before; the activation
skips the store read, its hop and the decrypt). A benchmark's stand-in, not the change: the
hand-over is taken by any `SecretVault.get` of that id, once. Only for a tree from before part 6
(run with `PYTHONPATH=<that tree>/src`), whose `SecretVault.put` wrote the sealed row: since
then the gateway hands over by itself, and the sealed row is written with the record."""

from __future__ import annotations

import runpy
import signal
import sys
from collections.abc import Mapping
from types import FrameType

from warmshell.core.ids import SandboxId
from warmshell.gateway.secretvault import SecretVault

_on = [False]
_handed: dict[str, dict[str, str]] = {}


def _wrap() -> None:
    if not hasattr(SecretVault, "put"):
        sys.exit("handover_gateway.py: this tree hands a create's secrets over itself (part 6); run an older one")
    put, get = SecretVault.put, SecretVault.get

    async def handing_put(self: SecretVault, sandbox_id: SandboxId, workspace: str, values: Mapping[str, str]) -> None:
        await put(self, sandbox_id, workspace, values)
        if _on[0] and values:
            _handed[sandbox_id] = dict(values)

    async def handed_get(self: SecretVault, sandbox_id: SandboxId) -> dict[str, str]:
        values = _handed.pop(sandbox_id, None)
        return values if values is not None else await get(self, sandbox_id)

    SecretVault.put = handing_put  # type: ignore[method-assign]
    SecretVault.get = handed_get  # type: ignore[method-assign]


def _switch(on: bool) -> None:
    _on[0] = on


if __name__ == "__main__":
    _wrap()

    def _switch_on(_s: int, _f: FrameType | None) -> None:
        _switch(True)

    def _switch_off(_s: int, _f: FrameType | None) -> None:
        _switch(False)

    signal.signal(signal.SIGUSR1, _switch_on)
    signal.signal(signal.SIGUSR2, _switch_off)
    sys.argv = ["warmshell", *sys.argv[1:]]
    runpy.run_module("warmshell", run_name="__main__", alter_sys=True)
