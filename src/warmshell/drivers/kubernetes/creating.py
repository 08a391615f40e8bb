"""Writing the one object a create makes — a Sandbox (cold, `create_sandbox`) or a SandboxClaim
(warm, from `warm`) — so that it exists exactly once: idempotent by name, and an ambiguous failure
is settled by reading back, never by writing blindly again."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from warmshell.core.allocation import MissReason
from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.errors import AlreadyExistsError, UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.core.models import now_us
from warmshell.drivers.base import CreateRequest, DriverSandbox
from warmshell.drivers.kubernetes import kube, naming, rendering, status
from warmshell.drivers.kubernetes.objects import Obj

__all__ = ["CREATE_ATTEMPTS", "create_sandbox", "create_settled"]

log = logging.getLogger(__name__)

# Creates after an ambiguous failure: each is preceded by a read proving the object is absent.
CREATE_ATTEMPTS = 3


async def create_sandbox(
    api: kube.Kube,
    config: KubernetesDriverConfig,
    request: CreateRequest,
    ref: naming.ObjectRef,
    who: rendering.SandboxIdentity,
    *,
    miss: MissReason,
) -> DriverSandbox:
    """A cold create: the Sandbox for `request`, rendered for the API version the cluster serves."""
    resource = await api.sandbox_resource(ref.namespace)
    body = rendering.render_sandbox(config, api_version=resource.api_version, ref=ref, who=who, spec=request.spec)
    created = await create_settled(api, resource, ref, body, request.sandbox_id, is_ours=status.is_managed)
    return dataclasses.replace(status.view(created, None), created_us=now_us(), miss_reason=miss.value)


async def create_settled(
    api: kube.Kube,
    resource: kube.Resource,
    ref: naming.ObjectRef,
    body: Obj,
    sandbox_id: SandboxId,
    *,
    is_ours: Callable[[Obj], bool],
) -> Obj:
    """The object created, or found under its name carrying this sandbox id; AlreadyExistsError
    when the name belongs to another sandbox, UnavailableError when the outcome stays unknown."""
    last: Exception | None = None
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            return await api.create(resource, ref.namespace, body)
        except kube.AlreadyExists:
            pass  # the name is taken, perhaps by our own earlier attempt: read it
        except (kube.Temporary, kube.Conflict) as exc:
            last = exc
            log.warning(
                "create of %s %s: %s; reading back (attempt %d/%d)", resource.kind, ref, exc, attempt, CREATE_ATTEMPTS
            )
        try:
            return _ours(await api.get(resource, ref.namespace, ref.name), ref, sandbox_id, is_ours)
        except kube.NotFound:
            continue  # provably absent: creating again cannot make a second one
        except kube.Temporary as exc:
            raise UnavailableError(
                f"creating {resource.kind} {ref}: outcome unknown ({last}; read back: {exc})"
            ) from exc
    raise UnavailableError(f"creating {resource.kind} {ref}: outcome unknown after {CREATE_ATTEMPTS} attempts ({last})")


def _ours(existing: Obj, ref: naming.ObjectRef, sandbox_id: SandboxId, is_ours: Callable[[Obj], bool]) -> Obj:
    if status.sandbox_id_of(existing) != sandbox_id or not is_ours(existing):
        kind = existing.get("kind") or "object"
        raise AlreadyExistsError(f"Kubernetes {kind} {ref} already exists and belongs to another sandbox")
    return existing
