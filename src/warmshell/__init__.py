"""warmshell: a control plane for AI-agent sandboxes with warm pools and verified identity.

The SDK (`warmshell.Client`, `warmshell.AsyncClient`, the errors and result types) is loaded on
first attribute access, so `import warmshell` stays cheap for the CLI and the supervisor, which
never pay for grpc or the SDK unless they use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warmshell.sdk import (
        Allocation,
        AlreadyExists,
        ApiError,
        AsyncClient,
        AsyncSandbox,
        Client,
        Condition,
        Conflict,
        DeadlineExceeded,
        Error,
        ExecResult,
        FailedPrecondition,
        InvalidArgument,
        Lifetime,
        NotFound,
        OutputEvent,
        PermissionDenied,
        Phase,
        PoolInfo,
        ResourceExhausted,
        Sandbox,
        SandboxError,
        SandboxInfo,
        Timeline,
        Unauthenticated,
        Unavailable,
    )

__version__ = "0.1.0"

__all__ = [
    "Allocation",
    "AlreadyExists",
    "ApiError",
    "AsyncClient",
    "AsyncSandbox",
    "Client",
    "Condition",
    "Conflict",
    "DeadlineExceeded",
    "Error",
    "ExecResult",
    "FailedPrecondition",
    "InvalidArgument",
    "Lifetime",
    "NotFound",
    "OutputEvent",
    "PermissionDenied",
    "Phase",
    "PoolInfo",
    "ResourceExhausted",
    "Sandbox",
    "SandboxError",
    "SandboxInfo",
    "Timeline",
    "Unauthenticated",
    "Unavailable",
    "__version__",
]

_SDK_NAMES = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from warmshell import sdk

        value = getattr(sdk, name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'warmshell' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SDK_NAMES})
