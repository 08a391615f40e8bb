"""kubesim's kube-proxy: Services that route.

Every Service with a ClusterIP (from 127.42.0.0/16, all local on Linux) is listened on at
``ClusterIP:port`` on the host (where pods without a network namespace of their own, and the
host's programs, reach it by name through their hosts file); each TCP connection goes to
the next ready endpoint of the Service's EndpointSlices, round-robin, and bytes are piped both
ways. An endpoint that is a pod with its own network namespace is dialled inside it at
``127.0.0.1:targetPort``; other endpoints at their address. Inside pod namespaces the API server's
address (``KUBERNETES_SERVICE_HOST:PORT``) is forwarded to the host's: that is all a pod with its
own namespace can dial (the gateway pod needs nothing else). A LoadBalancer
Service reports its ClusterIP as ``status.loadBalancer.ingress`` — the host reaches it there —
and a NodePort (or LoadBalancer) Service is also listened on at ``127.0.0.1:nodePort``, the nodes'
InternalIP.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import objects as o
from kubesim.controllers.endpointslices import SERVICE_NAME
from kubesim.controllers.informer import Informer
from kubesim.kubelet import netns

Obj = dict[str, Any]
log = logging.getLogger(__name__)
#: (where: None for the host or a netns path, address, port)
Listener = tuple[str | None, str, int]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def splice(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    backend: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Copy bytes both ways until both sides are done, then close both."""
    try:
        await asyncio.gather(_pipe(client[0], backend[1]), _pipe(backend[0], client[1]))
    finally:
        for writer in (client[1], backend[1]):
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()


class ServiceProxy:
    """Listeners for every Service port, on the host and in each pod network namespace."""

    def __init__(
        self,
        api: kc.KubeClient,
        *,
        services: Informer,
        slices: Informer,
        pod_namespaces: Callable[[], dict[str, str]],
        api_address: tuple[str, int],
    ) -> None:
        self._api = api
        self._services = services
        self._slices = slices
        # pod IP → network namespace path, for pods that have their own.
        self._pod_namespaces = pod_namespaces
        self._api_address = api_address
        self._servers: dict[Listener, asyncio.Server] = {}
        self._rr: dict[tuple[str, str, int], itertools.count[int]] = {}
        self._sync_task: asyncio.Task[None] | None = None
        self._dirty = False
        self._connections: set[asyncio.Task[None]] = set()
        services.add_handler(lambda *_: self.changed())

    def changed(self) -> None:
        """Something listeners depend on changed (Services, pod namespaces): resync soon."""
        self._dirty = True
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.get_running_loop().create_task(self._sync_loop())

    async def _sync_loop(self) -> None:
        while self._dirty:
            self._dirty = False
            try:
                await self._sync()
            except Exception:
                log.exception("service proxy: sync failed")

    def _wanted(self) -> dict[Listener, tuple[str, str, int] | None]:
        """Listener → (namespace, service, port) to route, or None for the API server."""
        wanted: dict[Listener, tuple[str, str, int] | None] = {}
        places: list[str | None] = [None, *sorted(set(self._pod_namespaces().values()))]
        for svc in self._services.items():
            spec = svc.get("spec") or {}
            ip = spec.get("clusterIP")
            if not ip or ip == "None":
                continue
            for port in spec.get("ports") or []:
                if port.get("protocol", "TCP") != "TCP":
                    continue
                # Host only: a listener inside a pod namespace would take the port from the pod's own
                # wildcard listener (real kube-proxy rewrites packets instead; kubesim has no NAT).
                route = (o.namespace_of(svc), o.name_of(svc), int(port["port"]))
                wanted[(None, ip, int(port["port"]))] = route
                if port.get("nodePort"):  # every node's address is 127.0.0.1 (the Node objects say so)
                    wanted[(None, "127.0.0.1", int(port["nodePort"]))] = route
        for place in places[1:]:
            wanted[(place, *self._api_address)] = None
        return wanted

    async def _sync(self) -> None:
        wanted = self._wanted()
        for listener in [k for k in self._servers if k not in wanted]:
            self._servers.pop(listener).close()
        for listener, target in wanted.items():
            if listener in self._servers:
                continue
            place, ip, port = listener
            try:
                sock = await netns.socket_in(place, bind=(ip, port)) if place else None
                handler = self._handler(target)
                if sock is None:
                    server = await asyncio.start_server(handler, ip, port, reuse_address=True)
                else:
                    server = await asyncio.start_server(handler, sock=sock)
            except OSError as exc:
                log.warning("service proxy: cannot listen on %s:%d (%s): %s", ip, port, place or "host", exc)
                continue
            self._servers[listener] = server
        await self._report_load_balancers()

    async def _report_load_balancers(self) -> None:
        for svc in self._services.items():
            spec = svc.get("spec") or {}
            if spec.get("type") != "LoadBalancer" or not spec.get("clusterIP"):
                continue
            ingress = [{"ip": spec["clusterIP"], "ipMode": "VIP"}]
            if ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") == ingress:
                continue
            with contextlib.suppress(kc.ApiError):
                patch = {"status": {"loadBalancer": {"ingress": ingress}}}
                await self._api.patch(kc.SERVICES, o.namespace_of(svc), o.name_of(svc), patch, sub="status")

    def _handler(
        self, target: tuple[str, str, int] | None
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is not None:
                self._connections.add(task)
                task.add_done_callback(self._connections.discard)
            try:
                backend = await (self._connect(*target) if target else asyncio.open_connection(*self._api_address))
            except (OSError, LookupError) as exc:
                log.debug("service proxy: no backend for %s: %s", target, exc)
                writer.close()
                return
            await splice((reader, writer), backend)

        return handle

    def endpoints(self, ns: str, name: str, port: int) -> list[tuple[str, int]]:
        """Ready (address, targetPort) pairs of a Service port, from its EndpointSlices."""
        svc = self._services.get(ns, name)
        if svc is None:
            return []
        port_name = next(
            (p.get("name", "") for p in (svc.get("spec") or {}).get("ports") or [] if int(p["port"]) == port), ""
        )
        out: list[tuple[str, int]] = []
        for eps in self._slices.items(ns):
            if o.labels_of(eps).get(SERVICE_NAME) != name:
                continue
            target = next((p.get("port") for p in eps.get("ports") or [] if p.get("name", "") == port_name), None)
            if target is None:
                continue
            for endpoint in eps.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready"):
                    out.extend((address, int(target)) for address in endpoint.get("addresses") or [])
        return sorted(out)

    async def _connect(self, ns: str, name: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ready = self.endpoints(ns, name, port)
        if not ready:
            raise LookupError(f"service {ns}/{name}:{port} has no ready endpoints")
        counter = self._rr.setdefault((ns, name, port), itertools.count())
        address, target = ready[next(counter) % len(ready)]
        place = self._pod_namespaces().get(address)
        return await netns.open_connection(place, "127.0.0.1" if place else address, target)

    async def aclose(self) -> None:
        """Stop listening and drop open connections."""
        if self._sync_task is not None:
            self._sync_task.cancel()
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        for task in list(self._connections):
            task.cancel()
