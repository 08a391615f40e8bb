"""The warmshell Python SDK: create sandboxes (warm or cold), run commands in them, follow their
output, and delete them, synchronously (`Client`) or with asyncio (`AsyncClient`).

    import warmshell

    with warmshell.Client() as client:
        with client.create(env={"A": "1"}, ttl_seconds=600) as sb:
            r = sb.run(["python3", "-c", "print(6*7)"])
            assert r.exit_code == 0 and r.stdout == b"42\\n"

`sb.files` reads, writes, lists and removes files in the sandbox (`warmshell.sdk.files`);
`sb.pty(...)` and `sb.start(...)` run a command with streamed stdin, on a terminal or not
(`warmshell.sdk.interactive`).

Every name is loaded on first use; `import warmshell.sdk` itself imports nothing.

Layout, top down:
- `client` / `aio`: the sync and asyncio clients and sandbox handles (`files`, `interactive`
  beside them for file transfer and streamed-stdin execs); `views` are the dataclasses they return.
- `calls`: the pure half both clients share — request builders (`create_request` and its
  `CreateOptions`, `exec_request`) and the folds that decide what a stream of events means
  (`WatchFold`: is the sandbox Ready, exited, failed?). `following.follow` is the sync loop that
  feeds a `WatchFold`, with a hook the CLI uses to render progress and output.
- `service.SandboxService`: typed calls (protobuf in and out) over a `transport`; the CLI uses
  it directly, since it renders the messages themselves.
- `transport`: grpcio, or the SDK's own small gRPC-over-HTTP/2 client (`http2`, `hpack`) on a
  local Unix socket. The CLI uses the latter because every CLI call is a new process and grpcio's
  import is most of a call's 100 ms budget: `python -X importtime`, after the protobuf stubs
  both need, 15 runs on a loaded 2-core host: `import grpc` median 80 ms (min 45),
  `import warmshell.sdk.transport` (with `http2` and `hpack`) median 16 ms (min 9); a quiet run
  gave 61 ms against 4 ms. Its idle connections (`http2_pool`) are watched by a thread, so a
  gateway's graceful stop is not held by them.
- `connection` finds the gateway and token; `errors` are the exceptions every call raises.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warmshell.core.states import Allocation, Phase
    from warmshell.sdk.aio import AsyncClient, AsyncSandbox
    from warmshell.sdk.client import Client, Sandbox
    from warmshell.sdk.errors import (
        AlreadyExists,
        ApiError,
        CommandFailed,
        CommandTimeout,
        Conflict,
        DeadlineExceeded,
        Error,
        FailedPrecondition,
        InvalidArgument,
        NotFound,
        PermissionDenied,
        ResourceExhausted,
        SandboxError,
        Unauthenticated,
        Unavailable,
    )
    from warmshell.sdk.interactive import AsyncProcess, Process
    from warmshell.sdk.processes import ProcessInfo
    from warmshell.sdk.views import (
        Condition,
        EgressDecision,
        ExecError,
        ExecOutcome,
        ExecResult,
        Lifetime,
        Network,
        OutputEvent,
        PoolInfo,
        SandboxInfo,
        Secret,
        Timeline,
        Usage,
    )

# Public name -> the module that defines it.
_EXPORTS = {
    "Allocation": "warmshell.core.states",
    "AlreadyExists": "warmshell.sdk.errors",
    "ApiError": "warmshell.sdk.errors",
    "CommandFailed": "warmshell.sdk.errors",
    "CommandTimeout": "warmshell.sdk.errors",
    "AsyncClient": "warmshell.sdk.aio",
    "AsyncProcess": "warmshell.sdk.interactive",
    "AsyncSandbox": "warmshell.sdk.aio",
    "Client": "warmshell.sdk.client",
    "Condition": "warmshell.sdk.views",
    "Conflict": "warmshell.sdk.errors",
    "EgressDecision": "warmshell.sdk.views",
    "DeadlineExceeded": "warmshell.sdk.errors",
    "Error": "warmshell.sdk.errors",
    "ExecError": "warmshell.sdk.views",
    "ExecOutcome": "warmshell.sdk.views",
    "ExecResult": "warmshell.sdk.views",
    "FailedPrecondition": "warmshell.sdk.errors",
    "InvalidArgument": "warmshell.sdk.errors",
    "Lifetime": "warmshell.sdk.views",
    "Network": "warmshell.sdk.views",
    "NotFound": "warmshell.sdk.errors",
    "OutputEvent": "warmshell.sdk.views",
    "PermissionDenied": "warmshell.sdk.errors",
    "Phase": "warmshell.core.states",
    "PoolInfo": "warmshell.sdk.views",
    "Process": "warmshell.sdk.interactive",
    "ProcessInfo": "warmshell.sdk.processes",
    "ResourceExhausted": "warmshell.sdk.errors",
    "Sandbox": "warmshell.sdk.client",
    "SandboxError": "warmshell.sdk.errors",
    "SandboxInfo": "warmshell.sdk.views",
    "Secret": "warmshell.sdk.views",
    "Timeline": "warmshell.sdk.views",
    "Unauthenticated": "warmshell.sdk.errors",
    "Unavailable": "warmshell.sdk.errors",
    "Usage": "warmshell.sdk.views",
}

__all__ = [
    "Allocation",
    "AlreadyExists",
    "ApiError",
    "AsyncClient",
    "AsyncProcess",
    "AsyncSandbox",
    "Client",
    "CommandFailed",
    "CommandTimeout",
    "Condition",
    "Conflict",
    "DeadlineExceeded",
    "EgressDecision",
    "Error",
    "ExecError",
    "ExecOutcome",
    "ExecResult",
    "FailedPrecondition",
    "InvalidArgument",
    "Lifetime",
    "Network",
    "NotFound",
    "OutputEvent",
    "PermissionDenied",
    "Phase",
    "PoolInfo",
    "Process",
    "ProcessInfo",
    "ResourceExhausted",
    "Sandbox",
    "SandboxError",
    "SandboxInfo",
    "Secret",
    "Timeline",
    "Unauthenticated",
    "Unavailable",
    "Usage",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'warmshell.sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
