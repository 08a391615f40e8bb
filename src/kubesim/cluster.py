"""A whole simulated cluster: the agent-sandbox controllers and the kubelet, wired to an API server.

``in_process`` is what ``kubesim serve`` runs in its API server's process, and ``running_cluster``
the one-line harness for tests (API server from ``kubesim.testing`` + everything here): the
components reach the server through its own request handler with the admin token
(``kubesim.inprocess``). ``run_controllers`` runs them against a server in another process, over
HTTP with a bearer token (``kubesim controllers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pathlib
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from kubesim import timing as timing_mod
from kubesim.controllers import client as kc
from kubesim.controllers.claim import ClaimController
from kubesim.controllers.crds_install import install_crds
from kubesim.controllers.deployments import DeploymentController
from kubesim.controllers.endpointslices import EndpointSliceController
from kubesim.controllers.events import Recorder
from kubesim.controllers.informer import Informer
from kubesim.controllers.replicasets import ReplicaSetController
from kubesim.controllers.rootca import RootCAPublisher
from kubesim.controllers.sandbox import SandboxController
from kubesim.controllers.template import TemplateController
from kubesim.controllers.warmpool import WarmPoolController
from kubesim.inprocess import InProcessClient
from kubesim.kubelet.images import ImageMap, ImageRule
from kubesim.kubelet.kubelet import Kubelet
from kubesim.kubelet.proxy import ServiceProxy

if TYPE_CHECKING:
    from kubesim.apiserver.server import ApiServer

log = logging.getLogger(__name__)

ImageMapLike = ImageMap | Mapping[str, ImageRule | list[str] | Mapping[str, Any]] | None


class Components:
    """Informers, controllers and kubelet sharing one HTTP client."""

    def __init__(
        self,
        api: kc.KubeClient,
        *,
        timing: timing_mod.Timing,
        image_map: ImageMapLike = None,
        pod_root: pathlib.Path | None = None,
        controllers: bool = True,
        kubelet: bool = True,
    ) -> None:
        self.api = api
        wt = timing.watch_timeout
        self.informers = {
            res.plural: Informer(api, res, watch_timeout=wt)
            for res in (
                kc.SANDBOXES,
                kc.PODS,
                kc.SERVICES,
                kc.TEMPLATES,
                kc.POOLS,
                kc.CLAIMS,
                kc.DEPLOYMENTS,
                kc.REPLICASETS,
                kc.ENDPOINTSLICES,
                kc.NAMESPACES,
            )
        }
        inf = self.informers
        self.queues: list[Any] = []
        self.events = Recorder(api)
        if controllers:
            self.sandbox = SandboxController(
                api,
                sandboxes=inf["sandboxes"],
                pods=inf["pods"],
                services=inf["services"],
                timing=timing,
                events=self.events,
            )
            self.template = TemplateController(api, templates=inf["sandboxtemplates"], timing=timing)
            self.warmpool = WarmPoolController(
                api,
                pools_informer=inf["sandboxwarmpools"],
                sandboxes=inf["sandboxes"],
                templates=inf["sandboxtemplates"],
                timing=timing,
            )
            self.claim = ClaimController(
                api,
                claims=inf["sandboxclaims"],
                sandboxes=inf["sandboxes"],
                pools_informer=inf["sandboxwarmpools"],
                templates=inf["sandboxtemplates"],
                timing=timing,
                events=self.events,
            )
            self.replicasets = ReplicaSetController(
                api, replicasets=inf["replicasets"], pods=inf["pods"], timing=timing
            )
            self.deployments = DeploymentController(
                api, deployments=inf["deployments"], replicasets=inf["replicasets"], pods=inf["pods"], timing=timing
            )
            self.endpointslices = EndpointSliceController(
                api, services=inf["services"], pods=inf["pods"], slices=inf["endpointslices"], timing=timing
            )
            self.queues = [
                self.endpointslices.queue,
                self.sandbox.queue,
                self.template.queue,
                self.warmpool.queue,
                self.claim.queue,
                self.replicasets.queue,
                self.deployments.queue,
            ]
            if api.ca_pem:
                self.root_ca = RootCAPublisher(api, namespaces=inf["namespaces"], ca_pem=api.ca_pem, timing=timing)
                self.queues.append(self.root_ca.queue)
        self.kubelet: Kubelet | None = None
        if kubelet:
            images = image_map if isinstance(image_map, ImageMap) else ImageMap(image_map)
            self.kubelet = Kubelet(
                api, pods=inf["pods"], timing=timing, image_map=images, root=pod_root, services=inf["services"]
            )
        self.proxy: ServiceProxy | None = None
        if self.kubelet is not None:
            url = urllib.parse.urlsplit(api.url)
            self.proxy = ServiceProxy(
                api,
                services=inf["services"],
                slices=inf["endpointslices"],
                pod_namespaces=self.kubelet.pod_namespaces,
                api_address=(url.hostname or "127.0.0.1", url.port or 443),
            )
            self.kubelet.on_netns_change.append(self.proxy.changed)
        self.synced = asyncio.Event()

    async def run(self) -> None:
        """Run until cancelled; on the way out kill every pod process."""
        try:
            await install_crds(self.api)
            if self.kubelet is not None:
                await self.kubelet.register_nodes()
            async with asyncio.TaskGroup() as tg:
                for informer in self.informers.values():
                    tg.create_task(informer.run(), name=f"informer:{informer.res.plural}")
                await asyncio.gather(*(i.synced.wait() for i in self.informers.values()))
                for queue in self.queues:
                    tg.create_task(queue.run(), name=f"queue:{queue.name}")
                self.synced.set()
        finally:
            if self.proxy is not None:
                await self.proxy.aclose()
            await self.events.aclose()
            if self.kubelet is not None:
                await asyncio.shield(self.kubelet.aclose())
            await self.api.aclose()


def _from_environment(
    timing: timing_mod.Timing | None, image_map: ImageMapLike
) -> tuple[timing_mod.Timing, ImageMapLike]:
    """``KUBESIM_TIMING`` (``default``/``fast``) and ``KUBESIM_IMAGE_MAP`` (a file, see
    ``kubesim.kubelet.images``) for what is not given, so ``kubesim serve`` is configured without
    new flags."""
    if timing is None:
        timing = timing_mod.profile(os.environ.get("KUBESIM_TIMING", "default"), os.environ)
    if image_map is None and os.environ.get("KUBESIM_IMAGE_MAP"):
        image_map = ImageMap.from_file(os.environ["KUBESIM_IMAGE_MAP"])
    return timing, image_map


async def run_controllers(
    *,
    url: str | None = None,
    token: str | None = None,
    kubeconfig: str | None = None,
    timing: timing_mod.Timing | None = None,
    image_map: ImageMapLike = None,
    pod_root: pathlib.Path | None = None,
    kubelet: bool = True,
    via: str = "",
) -> None:
    """Run the agent-sandbox controllers and the kubelet against the API server at ``url``, over
    HTTP, until cancelled (``kubesim controllers``: an API server in another process). The
    server's CA comes from ``kubeconfig`` (an admin kubeconfig), when given; so do the URL and
    token when they are not. With ``via`` the requests go there (a plain-HTTP listener), while
    pods are still told ``url``. Timing and image map as ``_from_environment`` says.
    """
    timing, image_map = _from_environment(timing, image_map)
    configured = kc.KubeClient.from_kubeconfig(kubeconfig, via=via) if kubeconfig else None
    if url is None or token is None:
        if configured is None:
            raise ValueError("run_controllers needs url and token, or an admin kubeconfig")
        api = configured
    else:
        api = kc.KubeClient(url, token, ca_pem=configured.ca_pem if configured else None, via=via)
    if timing.api_latency > 0:
        # API latency is the API server's to inject (its fault-injection admin endpoint).
        await api.request("POST", "/_kubesim/faults", body={"action": "latency", "seconds": timing.api_latency})
    await Components(api, timing=timing, image_map=image_map, pod_root=pod_root, kubelet=kubelet).run()


def in_process(
    server: ApiServer,
    *,
    timing: timing_mod.Timing | None = None,
    image_map: ImageMapLike = None,
    pod_root: pathlib.Path | None = None,
    kubelet: bool = True,
) -> Components:
    """The controllers and the kubelet of ``server`` (an ``ApiServer`` of this process), reaching
    it through its handler with the admin token (``kubesim.inprocess``); ``run()`` them. Timing
    and image map as ``_from_environment`` says; the timing's API latency is set on the server."""
    timing, image_map = _from_environment(timing, image_map)
    if timing.api_latency > 0:
        server.faults.add_latency(timing.api_latency)
    api = InProcessClient(server, server.admin_token)
    return Components(api, timing=timing, image_map=image_map, pod_root=pod_root, kubelet=kubelet)


@dataclasses.dataclass
class RunningCluster:
    """What ``running_cluster`` yields."""

    url: str
    token: str
    kubeconfig: str
    server: Any
    components: Components
    timing: timing_mod.Timing

    def client(self) -> kc.KubeClient:
        """A fresh HTTP client with the admin token (close it with ``aclose``)."""
        return kc.KubeClient(self.url, self.token, ca_pem=_ca(self.server))

    @property
    def pod_root(self) -> pathlib.Path | None:
        return self.components.kubelet.root if self.components.kubelet else None


@contextlib.asynccontextmanager
async def running_cluster(
    *,
    timing: timing_mod.Timing = timing_mod.FAST,
    image_map: ImageMapLike = None,
    pod_root: pathlib.Path | None = None,
    kubelet: bool = True,
    config: Any = None,
) -> AsyncIterator[RunningCluster]:
    """Start an API server (``kubesim.testing.running_apiserver``), the CRDs, the controllers and
    the kubelet; stop all of them (and every pod process) on exit. ``config`` is the API server's
    ``ServerConfig``; ``kubeconfig`` of the result is for the default (non-admin) user."""
    from kubesim import testing  # part 1's harness

    with tempfile.TemporaryDirectory(prefix="kubesim-") as tmp:
        kubeconfig = pathlib.Path(tmp) / "kubeconfig"
        async with testing.running_apiserver(config, kubeconfig=kubeconfig) as server:
            components = in_process(server, timing=timing, image_map=image_map, pod_root=pod_root, kubelet=kubelet)
            task = asyncio.create_task(components.run(), name="kubesim-components")
            try:
                synced = asyncio.create_task(components.synced.wait())
                done, _ = await asyncio.wait({synced, task}, return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    synced.cancel()
                    task.result()  # surfaces the startup failure
                yield RunningCluster(server.url, server.admin_token, str(kubeconfig), server, components, timing)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def _ca(server: Any) -> bytes | None:
    certificates = getattr(server, "certificates", None)
    return certificates.ca_pem if certificates is not None else None
