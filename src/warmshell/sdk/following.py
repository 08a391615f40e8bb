"""Following a sandbox's WatchSandbox stream through a `calls.WatchFold`: the one loop behind the
sync client's wait for Ready and `warmshell sandbox create`, which differ only in what they do
with each event on the way (`on_event`: the CLI's status line and the workload's output).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmshell.api.v1 import sandbox_pb2 as pb
    from warmshell.sdk import calls
    from warmshell.sdk.service import SandboxService

__all__ = ["follow"]


def follow(
    service: SandboxService,
    fold: calls.WatchFold,
    *,
    timeout: float | None,
    on_event: Callable[[pb.SandboxEvent], None] | None = None,
) -> None:
    """Feed `fold` its sandbox's events until it says the wait is over or the gateway ends the
    stream (`fold.last` is then the latest snapshot); `on_event` sees each event before the fold
    does. Past `timeout` seconds raises DeadlineExceeded; the stream is cancelled either way."""
    if fold.done():
        return
    stream = service.watch_sandbox(fold.watch_request(), timeout=timeout)
    try:
        for event in stream:
            if on_event is not None:
                on_event(event)
            if fold.feed(event):
                return
    finally:
        stream.cancel()
