"""What a handler uses of its call's context: the caller's metadata and a way to end the call.

A `grpc.aio.ServicerContext` has both; so has the context of a call made in process (a local
sandbox's host-side supervisor, see `inprocess`), which is why handlers and the authentication
they start with ask for no more than this.
"""

from __future__ import annotations

from typing import NoReturn, Protocol

import grpc

__all__ = ["CallContext"]


class CallContext(Protocol):
    """The part of a server call's context the handlers depend on."""

    def invocation_metadata(self) -> grpc.aio.Metadata | None:
        """The metadata the caller sent (its `authorization` among them)."""
        ...

    async def abort(self, code: grpc.StatusCode, details: str = ...) -> NoReturn:
        """End the call with a status: raises (`grpc.aio.AbortError` or a subclass)."""
        ...
