"""The store protocol the gateway depends on; SQLite implements it, Postgres can later."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Store", "StoredObject"]


@dataclass(frozen=True)
class StoredObject:
    """One row: `payload` is the object's JSON; `resource_version` moves on every write."""

    kind: str
    id: str
    name: str
    workspace: str
    resource_version: int
    payload: str


class Store(Protocol):
    """Compare-and-swap object storage. Writes raise ConflictError when the expected version
    moved, AlreadyExistsError on a duplicate (kind, workspace, name) or id."""

    async def create(self, *, kind: str, id: str, name: str, workspace: str, payload: str) -> StoredObject:
        """Insert a new object at resource_version 1."""
        ...

    async def get(self, kind: str, id: str) -> StoredObject | None:
        """The object with that id, if any."""
        ...

    async def get_by_name(self, kind: str, workspace: str, name: str) -> StoredObject | None:
        """The object with that name in that workspace, if any."""
        ...

    async def list(self, kind: str, workspace: str | None = None) -> list[StoredObject]:
        """Every object of a kind (in one workspace, or all)."""
        ...

    async def update(self, *, kind: str, id: str, expected_version: int, payload: str) -> StoredObject:
        """Replace the payload if the row is still at expected_version."""
        ...

    async def delete(self, kind: str, id: str, expected_version: int | None = None) -> bool:
        """Remove the row (only at expected_version when given); False when it was absent."""
        ...

    async def aclose(self) -> None:
        """Release the connection."""
        ...
