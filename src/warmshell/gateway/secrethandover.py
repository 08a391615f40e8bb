"""A create's secrets handed, in memory, to that create's own activation.

The create has the values in clear in its request and seals them into the vault before the
driver runs; a warm create's activation runs inside that same driver call. Reading the sealed
row back there cost a store round trip and a decrypt on cold caches (0.2-0.4 ms of the gateway's
CPU per warm create with a secret, 3-7 % of the whole create), so the create offers the values
here for the length of its driver call and the activation takes them.

What keeps this as tight as the vault (each property an attack test in
`tests/integration/security/test_secret_handover.py`):

- held no longer than the driver call that offered them: dropped when the activation takes them,
  when the call returns, fails or is cancelled (the offer is a context manager), or after
  `HOLD_SECONDS`, whichever comes first; the map holds at most the creates in flight;
- taken once, by sandbox id and the create's activation proof (fresh per create; a resume or a
  fork's child has its own): another sandbox's activation, a second activation of the same
  sandbox (a supervisor restarted, the next member after a failed one), another replica, or a
  gateway restarted in between find nothing here and read the sealed row, as before;
- taken only after the activation's own checks (registration, record, proof, identity) passed.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from warmshell.core.ids import SandboxId

__all__ = ["HOLD_SECONDS", "SecretHandover"]

# A warm create's activation comes within milliseconds of the offer, a local cold one within a
# second or two; one slower than this opens the sealed row instead (correct, only dearer).
HOLD_SECONDS = 10.0


@dataclass(eq=False)
class _Offer:
    proof: str = field(repr=False)
    values: dict[str, str] = field(repr=False)


class SecretHandover:
    """The secrets of the creates in flight, each until its own activation takes them."""

    def __init__(self, *, hold_seconds: float = HOLD_SECONDS) -> None:
        self._hold_seconds = hold_seconds
        self._offers: dict[SandboxId, _Offer] = {}

    def __len__(self) -> int:
        """How many offers are held (the creates in flight that carry secrets)."""
        return len(self._offers)

    @contextmanager
    def offered(self, sandbox_id: SandboxId, proof: str, values: Mapping[str, str]) -> Iterator[None]:
        """Offer `values` to the activation of `sandbox_id` that presents `proof`, for the body of
        the `with` (at most `hold_seconds`); nothing is offered when there are none."""
        if not values:
            yield
            return
        offer = _Offer(proof, dict(values))
        self._offers[sandbox_id] = offer
        timer = asyncio.get_running_loop().call_later(self._hold_seconds, self._drop, sandbox_id, offer)
        try:
            yield
        finally:
            timer.cancel()
            self._drop(sandbox_id, offer)

    def take(self, sandbox_id: SandboxId, proof: str) -> dict[str, str] | None:
        """The values offered for `sandbox_id` with this `proof`, once; None when there is no
        such offer (the caller then opens the sealed row)."""
        offer = self._offers.get(sandbox_id)
        if offer is None or not hmac.compare_digest(offer.proof.encode(), proof.encode()):
            return None
        del self._offers[sandbox_id]
        return offer.values

    def _drop(self, sandbox_id: SandboxId, offer: _Offer) -> None:
        if self._offers.get(sandbox_id) is offer:
            del self._offers[sandbox_id]
