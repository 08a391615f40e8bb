"""The store protocol the gateway depends on; SQLite (the default) and Postgres implement it."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["NewObject", "Store", "StoredObject", "rows_deleted"]


@dataclass(frozen=True)
class StoredObject:
    """One row: `payload` is the object's JSON; `resource_version` moves on every write."""

    kind: str
    id: str
    name: str
    workspace: str
    resource_version: int
    payload: str


@dataclass(frozen=True)
class NewObject:
    """An object to insert beside another in the same statement (`Store.create`'s `beside`)."""

    kind: str
    id: str
    name: str
    workspace: str
    payload: str = field(repr=False)


class Store(Protocol):
    """Compare-and-swap object storage. Writes raise ConflictError when the expected version
    moved, AlreadyExistsError on a duplicate (kind, workspace, name) or id."""

    async def create(
        self, *, kind: str, id: str, name: str, workspace: str, payload: str, beside: Sequence[NewObject] = ()
    ) -> StoredObject:
        """Insert a new object at resource_version 1, and `beside` with it in the same statement:
        all of them or, when any is a duplicate, none (AlreadyExistsError names the first)."""
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

    async def delete(
        self, kind: str, id: str, expected_version: int | None = None, *, beside: Sequence[tuple[str, str]] = ()
    ) -> bool:
        """Remove the row (only at expected_version when given); False when it was absent.
        `beside`: the (kind, id) of more rows removed in the same statement, whether or not
        they (or it) were there; only for a delete without expected_version (ValueError)."""
        ...

    async def dump(self) -> builtins.list[StoredObject]:
        """Every object of every kind (for copying a store)."""
        ...

    async def restore(self, obj: StoredObject) -> bool:
        """Write `obj` exactly as given, resource_version included, unless the store already holds
        it at that version or newer; True when it wrote. AlreadyExistsError when its name is taken
        by another id."""
        ...

    async def ping(self) -> None:
        """Check the store answers; UnavailableError (saying why) when it does not."""
        ...

    async def aclose(self) -> None:
        """Release the connection."""
        ...


def rows_deleted(
    kind: str, id: str, expected_version: int | None, beside: Sequence[tuple[str, str]]
) -> builtins.list[tuple[str, str]]:
    """The (kind, id) a `Store.delete` with `beside` removes in one statement, its own row first;
    ValueError with an expected_version (a compare-and-swap delete takes no rows beside it)."""
    if expected_version is not None:
        raise ValueError("rows beside a delete go only with an unconditional one")
    return [(kind, id), *beside]
