"""The one place domain errors become gRPC status codes."""

from __future__ import annotations

import grpc

from warmshell.core import errors

__all__ = ["status_code_for"]

_CODES: list[tuple[type[errors.WarmshellError], grpc.StatusCode]] = [
    (errors.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (errors.ConflictError, grpc.StatusCode.ABORTED),
    (errors.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.UnavailableError, grpc.StatusCode.UNAVAILABLE),
]


def status_code_for(exc: errors.WarmshellError) -> grpc.StatusCode:
    """The status code a domain error is reported with (INTERNAL for anything unmapped)."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL
