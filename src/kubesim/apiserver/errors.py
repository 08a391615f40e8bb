"""Kubernetes ``Status`` errors: every failure a handler raises becomes one of these.

The reason/code pairs and message shapes follow k8s.io/apimachinery/pkg/api/errors so clients
(kubectl, kubernetes_asyncio) print and classify them exactly as they would for a real server.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error that is answered with a ``Status`` object and the matching HTTP code."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        """Return the ``Status`` object for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(name: str, group: str, kind: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    details.update(extra)
    return details


def qualified(resource: str, group: str) -> str:
    """``pods`` or ``sandboxes.agents.x-k8s.io``: how the server names a resource in messages."""
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> ApiError:
    """404 for a missing object."""
    return ApiError(
        404,
        "NotFound",
        f'{qualified(resource, group)} "{name}" not found',
        details=_details(name, group, resource),
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    """409 for a create whose name is taken."""
    return ApiError(
        409,
        "AlreadyExists",
        f'{qualified(resource, group)} "{name}" already exists',
        details=_details(name, group, resource),
    )


def conflict(resource: str, group: str, name: str, why: str) -> ApiError:
    """409 Conflict: stale resourceVersion or a failed precondition."""
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
        details=_details(name, group, resource),
    )


STALE_OBJECT = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, group: str, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid with one cause per field error, message as field.ErrorList prints it."""
    rendered = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    return ApiError(
        422,
        "Invalid",
        f'{kind}{"." + group if group else ""} "{name}" is invalid: {summary}',
        details=_details(name, group, kind, causes=causes),
    )


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> ApiError:
    """415 for bodies we cannot decode (protobuf, CBOR, unknown patch types)."""
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        f'application/json, application/yaml; got "{content_type}"',
    )


def gone(message: str) -> ApiError:
    """410 Expired: a resourceVersion or continue token older than the retained window."""
    return ApiError(410, "Expired", message)


def unauthorized() -> ApiError:
    """401 for a missing or unknown bearer token."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden(message: str, *, resource: str = "", group: str = "", name: str = "") -> ApiError:
    """403 Forbidden."""
    return ApiError(403, "Forbidden", message, details=_details(name, group, resource))


def internal(message: str) -> ApiError:
    """500 InternalError."""
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        details={"causes": [{"message": message}]},
    )
