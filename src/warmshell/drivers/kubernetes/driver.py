"""The Kubernetes compute driver, part 1: each sandbox is an agent-sandbox `Sandbox` (one pod).

A cold create renders the Sandbox (`rendering`), seals the activation proof onto it (`proofs`) and
creates it — one API write. agent-sandbox makes the pod; its supervisor registers with the pod's
projected token and `identity` binds it to the sandbox. Reads go to the API (`get`, `list`);
`watch` is fed by `informers` over our Sandboxes, their pods and the namespace's Events, started
by the first watcher and shared by all.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
from pathlib import Path
from typing import Any

from warmshell.core.config import KubernetesDriverConfig, StatePaths
from warmshell.core.errors import AlreadyExistsError, FailedPreconditionError, InvalidArgumentError, UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxSpec, now_us
from warmshell.drivers.base import (
    Activator,
    CreateRequest,
    DriverEvent,
    DriverSandbox,
    PoolView,
    ProgressLine,
)
from warmshell.drivers.kubernetes import kube, labels, naming, proofs, rendering, status, watching
from warmshell.drivers.kubernetes.events import Hub, Subscription
from warmshell.drivers.kubernetes.identity import KubernetesIdentity
from warmshell.drivers.kubernetes.informers import Informers

__all__ = ["KubernetesDriver"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# Creates after an ambiguous failure: each is preceded by a read proving the object is absent.
CREATE_ATTEMPTS = 3
DELETE_ATTEMPTS = 3


class KubernetesDriver:
    """A `ComputeDriver` creating agent-sandbox Sandboxes in one namespace (shared mode)."""

    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesDriverConfig,
        paths: StatePaths,
        *,
        api: kube.Kube | None = None,
        watch_backoff: watching.Backoff | None = None,
    ) -> None:
        if not config.gateway_address:
            raise FailedPreconditionError(
                "kubernetes.gateway_address is not set: the gateway's supervisor API as pods reach it"
            )
        self._config = config
        self._key_path = Path(config.proof_key_file) if config.proof_key_file else paths.root / "kubernetes-proof.key"
        self._api = api
        self._owns_api = api is None
        self._backoff = watch_backoff or watching.Backoff()
        self._identity: KubernetesIdentity | None = None
        self._activator: Activator | None = None
        self._sealer: proofs.ProofSealer | None = None
        self._hub = Hub()
        self._informers: Informers | None = None  # started by the first watch()

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> KubernetesDriver:
        key = await asyncio.to_thread(proofs.load_or_create_key, self._key_path)
        self._sealer = proofs.ProofSealer(key)
        if self._api is None:
            self._api = await kube.Kube.connect(self._config)
        self._identity = KubernetesIdentity(self._api, self._config, self._sealer, on_registered=self._registered)
        try:
            await self._api.sandbox_resource(self._config.namespace)
        except kube.Temporary as exc:
            # Not fatal: the probe runs again on first use.
            log.warning("kubernetes driver: cannot reach the API yet (%s)", exc)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self, activator: Activator) -> None:
        """Cold sandboxes are activated by registration alone; warm pools (part 2) keep this."""
        self._activator = activator

    async def aclose(self) -> None:
        """Stop the informers and end watches; sandboxes keep running in the cluster."""
        if self._informers is not None:
            await self._informers.aclose()
            self._informers = None
        self._hub.close()
        if self._owns_api and self._api is not None:
            await self._api.aclose()
            self._api = None

    @property
    def identity(self) -> KubernetesIdentity:
        """Verifies the projected tokens of sandbox pods."""
        if self._identity is None:
            raise FailedPreconditionError("the kubernetes driver is not started (use `async with`)")
        return self._identity

    @property
    def api(self) -> kube.Kube:
        """The API adapter (after `__aenter__`)."""
        if self._api is None:
            raise FailedPreconditionError("the kubernetes driver is not started (use `async with`)")
        return self._api

    # -- the ComputeDriver surface ---------------------------------------------------------

    def default_image(self) -> str:
        """The configured supervisor image."""
        return self._config.image

    def validate(self, workspace: str, spec: SandboxSpec) -> None:
        """An image is a container image reference that ships `warmshell` (see the README)."""
        if spec.image and any(c.isspace() for c in spec.image):
            raise InvalidArgumentError("spec.image", f"{spec.image!r} is not a container image reference")

    async def create(self, request: CreateRequest) -> DriverSandbox:
        """Create the Sandbox (idempotent by name); an ambiguous failure is settled by reading it
        back, never by writing blindly again; UnavailableError when it cannot be settled."""
        ref = naming.object_ref(self._config, request.workspace, request.name)
        self.validate(request.workspace, request.spec)
        resource = await self.api.sandbox_resource(ref.namespace)
        body = rendering.render_sandbox(
            self._config,
            api_version=resource.api_version,
            ref=ref,
            who=rendering.SandboxIdentity(
                sandbox_id=request.sandbox_id,
                workspace=request.workspace,
                name=request.name,
                sealed_proof=self._seal(request, ref),
            ),
            spec=request.spec,
        )
        created = await self._create_settled(resource, ref, body, request.sandbox_id)
        self._progress(request.sandbox_id, "Created", f"Sandbox {ref} created (cold)")
        return dataclasses.replace(status.view(created, None), created_us=now_us())

    async def get(self, sandbox_id: SandboxId) -> DriverSandbox | None:
        """The Sandbox carrying this id and its pod, read from the API now."""
        resource = await self.api.sandbox_resource(self._config.namespace)
        found = await self._find(resource, sandbox_id)
        if found is None:
            return None
        return status.view(found, await self._pod_of(found))

    async def list(self) -> list[DriverSandbox]:
        """Every Sandbox with our labels (others are ignored), with its pod."""
        namespace = self._config.namespace
        resource = await self.api.sandbox_resource(namespace)
        sandboxes = await self.api.list(resource, namespace, label_selector=labels.managed_selector())
        pods = await self.api.list(kube.PODS, namespace, label_selector=labels.managed_selector())
        by_name = {p["metadata"]["name"]: p for p in pods.get("items") or []}
        views = []
        for sandbox in sandboxes.get("items") or []:
            if status.is_managed(sandbox):
                views.append(status.view(sandbox, status.own_pod(sandbox, by_name.get(status.owned_pod_name(sandbox)))))
        return views

    async def delete(self, sandbox_id: SandboxId) -> bool:
        """Delete the Sandbox (its pod goes with it) with its uid as precondition, so a Sandbox
        recreated meanwhile under the same name is never deleted by mistake."""
        resource = await self.api.sandbox_resource(self._config.namespace)
        for _ in range(DELETE_ATTEMPTS):
            found = await self._find(resource, sandbox_id)
            if found is None:
                return False
            meta = found["metadata"]
            try:
                await self.api.delete(resource, meta["namespace"], meta["name"], uid=meta["uid"])
            except kube.NotFound:
                return False
            except kube.Conflict:
                continue  # replaced between the read and the delete: look again
            return True
        raise UnavailableError(f"Sandbox of {sandbox_id} kept changing; delete not confirmed")

    def watch(self) -> Subscription:
        """Sandbox and pod changes and pod Events as progress lines, from this call on, until the
        driver closes (`aclose()` the result to stop early)."""
        if self._informers is None:
            self._informers = Informers(self.api, self._config.namespace, self._hub, self._backoff)
            self._informers.start()
        return self._hub.subscribe()

    def pools(self) -> builtins.list[PoolView]:
        """No warm pools yet (Kubernetes part 2)."""
        return []

    # -- create helpers --------------------------------------------------------------------

    def _seal(self, request: CreateRequest, ref: naming.ObjectRef) -> str:
        assert self._sealer is not None
        return self._sealer.seal(
            request.activation_proof, namespace=ref.namespace, name=ref.name, sandbox_id=request.sandbox_id
        )

    async def _create_settled(
        self, resource: kube.Resource, ref: naming.ObjectRef, body: Obj, sandbox_id: SandboxId
    ) -> Obj:
        last: Exception | None = None
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                return await self.api.create(resource, ref.namespace, body)
            except kube.AlreadyExists:
                pass  # the name is taken, perhaps by our own earlier attempt: read it
            except (kube.Temporary, kube.Conflict) as exc:
                last = exc
                log.warning(
                    "create of Sandbox %s: %s; reading back (attempt %d/%d)", ref, exc, attempt, CREATE_ATTEMPTS
                )
            try:
                return self._ours(await self.api.get(resource, ref.namespace, ref.name), ref, sandbox_id)
            except kube.NotFound:
                continue  # provably absent: creating again cannot make a second one
            except kube.Temporary as exc:
                raise UnavailableError(f"creating Sandbox {ref}: outcome unknown ({last}; read back: {exc})") from exc
        raise UnavailableError(f"creating Sandbox {ref}: outcome unknown after {CREATE_ATTEMPTS} attempts ({last})")

    @staticmethod
    def _ours(existing: Obj, ref: naming.ObjectRef, sandbox_id: SandboxId) -> Obj:
        if status.sandbox_id_of(existing) != sandbox_id or not status.is_managed(existing):
            raise AlreadyExistsError(f"Kubernetes Sandbox {ref} already exists and belongs to another sandbox")
        return existing

    async def _find(self, resource: kube.Resource, sandbox_id: SandboxId) -> Obj | None:
        """Lookups by id go through the label, never the name alone."""
        selector = labels.sandbox_selector(sandbox_id)
        found = await self.api.list(resource, self._config.namespace, label_selector=selector)
        items = [s for s in found.get("items") or [] if status.sandbox_id_of(s) == sandbox_id]
        if len(items) > 1:
            log.warning("%d Sandboxes carry sandbox id %s; using the oldest", len(items), sandbox_id)
            items.sort(key=lambda s: s["metadata"].get("creationTimestamp") or "")
        return items[0] if items else None

    async def _pod_of(self, sandbox: Obj) -> Obj | None:
        try:
            pod = await self.api.get(kube.PODS, sandbox["metadata"]["namespace"], status.owned_pod_name(sandbox))
        except kube.NotFound:
            return None
        return status.own_pod(sandbox, pod)

    # -- progress --------------------------------------------------------------------------

    def _registered(self, sandbox_id: SandboxId, pod_name: str) -> None:
        self._progress(sandbox_id, "Registered", f"the supervisor in pod {pod_name} registered")

    def _progress(self, sandbox_id: SandboxId, reason: str, message: str) -> None:
        self._hub.publish(DriverEvent(sandbox_id, progress=ProgressLine(reason, message)))
