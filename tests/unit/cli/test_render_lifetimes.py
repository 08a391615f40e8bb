"""Rendering of the Exited phase and of a sandbox's lifetime (`sandbox list`, `sandbox get`)."""

from __future__ import annotations

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli import render


def test_an_exited_sandbox_reads_as_finished_with_its_code() -> None:
    assert render.phase_label(pb.SandboxStatus(phase=pb.SANDBOX_PHASE_EXITED, exit_code=0)) == "Exited (0)"
    assert render.phase_label(pb.SandboxStatus(phase=pb.SANDBOX_PHASE_EXITED, exit_code=3)) == "Exited (3)"
    assert render.phase_label(pb.SandboxStatus(phase=pb.SANDBOX_PHASE_ERROR)) == "Error"
    exited = pb.SandboxStatus(phase=pb.SANDBOX_PHASE_EXITED, exit_code=0)
    table = render.sandbox_table([pb.Sandbox(name="job", workspace="default", status=exited)], now_ms=0)
    row = table.splitlines()[1].split()
    assert row[:4] == ["job", "default", "Exited", "(0)"]


def test_expiry_text_names_the_instant_the_ttl_and_the_idle_timeout() -> None:
    assert render.expiry_text(pb.Lifetime()) == "never"
    lifetime = pb.Lifetime(ttl_seconds=600, expires_at_ms=1_800_000_000_000, idle_timeout_seconds=60)
    assert render.expiry_text(lifetime) == "2027-01-15T08:00:00+00:00 (ttl 600 s); after 60 s without an exec"
    details = render.sandbox_details(pb.Sandbox(name="x", lifetime=lifetime)).splitlines()
    expires = next(line for line in details if line.startswith("Expires"))
    assert expires.split(None, 1)[1] == render.expiry_text(lifetime)
