"""What a fork makes of its parent (pure): the children's names, and each child's create, which
is the parent's spec on the parent's snapshot, with its lifetime and labels, and its secrets only
when the request asks for them."""

from __future__ import annotations

from collections.abc import Mapping

from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import SandboxRecord
from warmshell.core.specs import NewSandbox
from warmshell.core.validation import validate_name

__all__ = ["child_names", "child_sandbox"]

COUNT_KEY = "local.max_fork_count"


def child_names(parent: str, prefix: str, count: int, *, most: int) -> list[str]:
    """PREFIX-1 .. PREFIX-COUNT (PREFIX defaults to PARENT-fork); InvalidArgumentError naming
    `count` outside 1..`most`, or `prefix` when a name would not be a sandbox name."""
    if not 1 <= count <= most:
        raise InvalidArgumentError("count", f"must be between 1 and {most} ({COUNT_KEY}), not {count}")
    base = prefix or f"{parent}-fork"
    names = [f"{base}-{number}" for number in range(1, count + 1)]
    for name in names:
        try:
            validate_name(name)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError("prefix", f"makes the child name {name!r}, which {exc.rule}") from None
    return names


def child_sandbox(parent: SandboxRecord, name: str, image: str, secrets: Mapping[str, str] | None) -> NewSandbox:
    """The create of child `name` of `parent` on `image` (its snapshot); `secrets` None: none."""
    # A shallow copy, as every spec is: nothing changes a spec's parts in place (the create path
    # replaces them), and a deep one cost ~85 us a child against ~15, in a fork's event loop.
    changes: dict[str, object] = {"image": image}
    if secrets is None:
        changes.update(secret_names=[], secret_hosts={})
    spec = parent.spec.model_copy(update=changes)
    lifetime = parent.lifetime
    return NewSandbox(
        workspace=parent.workspace,
        name=name,
        spec=spec,
        labels=dict(parent.labels),
        secrets=dict(secrets or {}),
        ttl_seconds=lifetime.ttl_seconds,
        idle_timeout_seconds=lifetime.idle_timeout_seconds,
    )
