"""The create request's lifetime crosses the edge with presence kept: unset means "the default",
0 means "no limit"; a stored lifetime goes back out on the wire."""

from __future__ import annotations

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.ids import SandboxId
from warmshell.core.models import Lifetime, SandboxRecord
from warmshell.gateway import convert


def test_unset_and_zero_are_told_apart() -> None:
    unset = convert.new_sandbox(pb.CreateSandboxRequest())
    assert (unset.ttl_seconds, unset.idle_timeout_seconds) == (None, None)
    zero = convert.new_sandbox(pb.CreateSandboxRequest(ttl_seconds=0, idle_timeout_seconds=30))
    assert (zero.ttl_seconds, zero.idle_timeout_seconds) == (0, 30)


def test_the_stored_lifetime_is_on_the_wire() -> None:
    record = SandboxRecord(
        id=SandboxId("i"), name="n", lifetime=Lifetime(ttl_seconds=60, expires_at_ms=5, idle_timeout_seconds=7)
    )
    wire = convert.sandbox_to_proto(record).lifetime
    assert (wire.ttl_seconds, wire.expires_at_ms, wire.idle_timeout_seconds) == (60, 5, 7)
