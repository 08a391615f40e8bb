"""`SandboxInfo.usage` from the wire: unset figures are None (not 0), and a message without a
usage (a listing) gives None."""

from __future__ import annotations

import warmshell
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk import views


def test_figures_set_on_the_wire_and_unset_ones_are_none() -> None:
    usage = pb.SandboxUsage(cpu_seconds=0.5, memory_bytes=0, processes=2, unknown="why", read_at_ms=7)
    info = views.sandbox_info(pb.Sandbox(status=pb.SandboxStatus(usage=usage)))
    assert info.usage == warmshell.Usage(cpu_seconds=0.5, memory_bytes=0, processes=2, unknown="why", read_at_ms=7)
    assert info.usage.workspace_bytes is None


def test_a_listed_sandbox_has_no_usage() -> None:
    assert views.sandbox_info(pb.Sandbox(name="x")).usage is None
