"""Domain errors, split at the boundary into permanent and temporary; mapped to gRPC codes in one
place (warmshell.gateway.errors)."""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "ConflictError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnavailableError",
    "WarmshellError",
]


class WarmshellError(Exception):
    """Base of every error warmshell raises on purpose."""


class InvalidArgumentError(WarmshellError):
    """A request field broke a rule; the message names the field and the rule."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class NotFoundError(WarmshellError):
    """The named object does not exist."""


class AlreadyExistsError(WarmshellError):
    """An object with that identity already exists."""


class ConflictError(WarmshellError):
    """A compare-and-swap write lost the race (the resource version moved)."""


class FailedPreconditionError(WarmshellError):
    """The object is not in a state that allows the operation."""


class PermissionDeniedError(WarmshellError):
    """The caller's identity does not allow the operation."""


class ResourceExhaustedError(WarmshellError):
    """The caller went over a limit (a rate or a count); it may retry later."""


class UnavailableError(WarmshellError):
    """A temporary failure; the caller may retry (the outcome may be unknown)."""
