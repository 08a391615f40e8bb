"""The generated protobuf/gRPC stubs must match proto/ (run scripts/gen_proto.py to refresh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_stubs_are_not_stale(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), str(tmp_path)], check=True, capture_output=True
    )
    package = ROOT / "src" / "warmshell" / "api" / "v1"
    generated = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in package.iterdir() if p.is_file()}
    assert generated.keys() == committed.keys(), "generated file set differs; run scripts/gen_proto.py"
    stale = [name for name in generated if generated[name] != committed[name]]
    assert not stale, f"stale generated stubs: {stale}; run scripts/gen_proto.py"


def test_public_surface_is_pinned() -> None:
    import warmshell

    # The SDK's names (tests/unit/sdk/test_exports.py checks they resolve, lazily).
    assert warmshell.__all__ == [
        "Allocation", "AlreadyExists", "ApiError", "AsyncClient", "AsyncProcess", "AsyncSandbox", "Client",
        "CommandFailed", "CommandTimeout", "Condition", "Conflict", "DeadlineExceeded", "EgressDecision", "Error",
        "ExecError", "ExecOutcome", "ExecResult", "FailedPrecondition", "InvalidArgument", "Lifetime", "Network",
        "NotFound", "OutputEvent", "PermissionDenied", "Phase", "PoolInfo", "Process", "ProcessInfo",
        "ResourceExhausted", "Sandbox", "SandboxError", "SandboxInfo", "Secret", "Timeline", "Unauthenticated",
        "Unavailable", "Usage",
        "__version__",
    ]  # fmt: skip
