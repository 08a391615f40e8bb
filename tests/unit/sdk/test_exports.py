"""The public surface of `warmshell`: pinned, and loaded lazily so `import warmshell` stays cheap."""

from __future__ import annotations

import subprocess
import sys

import warmshell
from warmshell import sdk

EXPECTED = [
    "Allocation", "AlreadyExists", "ApiError", "AsyncClient", "AsyncSandbox", "Client", "Condition", "Conflict",
    "DeadlineExceeded", "Error", "ExecResult", "FailedPrecondition", "InvalidArgument", "Lifetime", "NotFound",
    "OutputEvent", "PermissionDenied", "Phase", "PoolInfo", "ResourceExhausted", "Sandbox", "SandboxError",
    "SandboxInfo", "Timeline", "Unauthenticated", "Unavailable",
]  # fmt: skip


def test_the_public_names_are_pinned() -> None:
    assert sdk.__all__ == EXPECTED
    assert warmshell.__all__ == sorted(["__version__", *EXPECTED])
    for name in EXPECTED:
        assert getattr(warmshell, name) is getattr(sdk, name)


def test_import_warmshell_loads_neither_grpc_nor_the_sdk() -> None:
    probe = (
        "import sys, warmshell; "
        "assert 'grpc' not in sys.modules and 'warmshell.sdk.client' not in sys.modules, sorted(sys.modules); "
        "warmshell.Client; "
        "assert 'grpc' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


def test_the_connection_helpers_load_without_grpc() -> None:
    probe = "import sys, warmshell.sdk.connection; assert 'grpc' not in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
