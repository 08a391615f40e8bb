"""The hand-over of a create's secrets to its own activation: taken once, by id and proof; held
only while offered, and never past the bound."""

from __future__ import annotations

import asyncio
import contextlib

import hypothesis
from hypothesis import strategies as st

from warmshell.core.ids import SandboxId
from warmshell.gateway.secrethandover import SecretHandover

_IDS = [SandboxId(f"s{n}") for n in range(3)]
_PROOFS = ["p0", "p1"]
# An operation: open an offer of (id, proof), close the oldest open one, or take (id, proof).
_OPS = st.lists(
    st.tuples(st.sampled_from(["offer", "close", "take"]), st.sampled_from(_IDS), st.sampled_from(_PROOFS)),
    max_size=30,
)


@hypothesis.given(_OPS)
def test_an_offer_is_taken_once_by_its_id_and_proof_and_gone_once_closed(ops: list[tuple[str, SandboxId, str]]) -> None:
    async def run() -> None:
        handover = SecretHandover()
        with contextlib.ExitStack() as stack:
            opened: list[tuple[contextlib.ExitStack, SandboxId]] = []
            # What a take may find: the values of the open offer of that id not taken yet.
            available: dict[SandboxId, tuple[str, dict[str, str]]] = {}
            for op, sandbox_id, proof in ops:
                if op == "offer" and sandbox_id not in available and all(i != sandbox_id for _, i in opened):
                    values = {"K": f"{sandbox_id}-{proof}"}
                    scope = contextlib.ExitStack()
                    scope.enter_context(handover.offered(sandbox_id, proof, values))
                    stack.callback(scope.close)
                    opened.append((scope, sandbox_id))
                    available[sandbox_id] = (proof, values)
                elif op == "close" and opened:
                    scope, closed = opened.pop(0)
                    scope.close()
                    available.pop(closed, None)
                elif op == "take":
                    expected = available.get(sandbox_id)
                    taken = handover.take(sandbox_id, proof)
                    if expected is not None and expected[0] == proof:
                        assert taken == expected[1]
                        del available[sandbox_id]
                    else:
                        assert taken is None
                assert len(handover) == len(available)
        assert len(handover) == 0

    asyncio.run(run())


async def test_nothing_is_offered_without_values() -> None:
    handover = SecretHandover()
    with handover.offered(SandboxId("s"), "p", {}):
        assert len(handover) == 0
        assert handover.take(SandboxId("s"), "p") is None


async def test_an_offer_is_dropped_at_its_bound_while_still_offered() -> None:
    handover = SecretHandover(hold_seconds=0.02)
    with handover.offered(SandboxId("s"), "p", {"K": "v"}):
        await asyncio.sleep(0.1)
        assert len(handover) == 0
        assert handover.take(SandboxId("s"), "p") is None


async def test_a_taken_value_is_a_copy_of_the_offer() -> None:
    handover = SecretHandover()
    values = {"K": "v"}
    with handover.offered(SandboxId("s"), "p", values):
        values["K"] = "changed after the offer"
        assert handover.take(SandboxId("s"), "p") == {"K": "v"}
