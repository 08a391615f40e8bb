"""`sandbox get`'s usage rows: every figure, unknown ones and why, and none for other messages."""

from __future__ import annotations

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli import render


def _lines(sandbox: pb.Sandbox) -> list[str]:
    return [" ".join(line.split()) for line in render.sandbox_details(sandbox).splitlines()]


def test_every_figure_a_driver_read() -> None:
    usage = pb.SandboxUsage(
        cpu_seconds=1.234,
        memory_bytes=12 * 2**20,
        memory_peak_bytes=30 * 2**20,
        processes=3,
        workspace_bytes=5 * 2**20 + 1,
        root_bytes=2048,
    )
    lines = _lines(pb.Sandbox(status=pb.SandboxStatus(usage=usage)))
    assert "CPU used 1.23s" in lines
    assert "Memory 12.0MiB (peak 30.0MiB)" in lines
    assert "Processes 3" in lines
    assert "/workspace 5.0MiB" in lines
    assert "Writable root 2.0KiB" in lines
    assert not any(line.startswith("Usage unknown") for line in lines)


def test_unknown_figures_say_why_and_zero_is_a_figure() -> None:
    usage = pb.SandboxUsage(workspace_bytes=0, unknown="cpu, memory and processes: no cgroup")
    lines = _lines(pb.Sandbox(status=pb.SandboxStatus(usage=usage)))
    assert "CPU used ?" in lines
    assert "Memory ?" in lines
    assert "/workspace 0B" in lines
    assert "Usage unknown cpu, memory and processes: no cgroup" in lines
    assert not any(line.startswith("Writable root") for line in lines)  # shown only where a driver has one


def test_a_usage_without_figures_is_one_line_saying_why() -> None:
    usage = pb.SandboxUsage(unknown="the sandbox is Exited, not running", read_at_ms=5)
    lines = _lines(pb.Sandbox(status=pb.SandboxStatus(usage=usage)))
    assert "Usage unknown: the sandbox is Exited, not running" in lines
    assert not any(line.startswith(("CPU used", "Memory", "Processes", "/workspace")) for line in lines)


def test_a_message_without_usage_shows_no_usage_rows() -> None:
    lines = _lines(pb.Sandbox(name="x"))
    assert not any(line.startswith(("CPU used", "Memory", "Processes", "/workspace")) for line in lines)


def test_format_bytes() -> None:
    assert [render.format_bytes(n) for n in (0, 1023, 1024, 3 * 2**29, 2**40)] == [
        "0B",
        "1023B",
        "1.0KiB",
        "1.5GiB",
        "1024.0GiB",
    ]
