"""The kubelet and scheduler of kubesim's simulated nodes.

The scheduler binds each unscheduled Pod to a node (round robin over ``nodes``) after the
scheduling delay; the kubelet starts a ``PodWorker`` for every Pod bound to one of its nodes. A Pod
with a ``deletionTimestamp`` is stopped gracefully (SIGTERM, SIGKILL after its grace period) and
then removed with ``gracePeriodSeconds=0``, as the real kubelet finishes a graceful deletion. When
the kubelet stops it kills every process it started.

Processes are not in containers: each pod has a root directory and a volume mounted at
``mountPath`` is found at ``$KUBESIM_POD_ROOT/<mountPath>`` (``kubesim.kubelet.volumes``), so a
projected ServiceAccount token at ``/var/run/secrets/tokens/token`` is read from
``$KUBESIM_POD_ROOT/var/run/secrets/tokens/token``. Run as root, the kubelet also gives each
container its own mount namespace (``kubesim.kubelet.mountns``) in which the volumes are at their
real ``mountPath`` and ``/etc/hosts`` is the pod's, so in-cluster credentials and config files are
read unchanged; there it sees only the volumes it mounts (no other container's, no other pod's)
and, unless the pod sets ``shareProcessNamespace``, is PID 1 of a PID namespace of its own, as
the containers of one pod are apart on a real node. Images map to local commands through
``kubesim.kubelet.images.ImageMap``.

Pod IPs are loopback addresses from 127.1.0.0/16. A pod without ports shares the host network (an
address in 127/8 is reachable on Linux, so dialling its IP reaches a process listening on
0.0.0.0); a pod that declares container ports gets a network namespace of its own
(``kubesim.kubelet.netns``), so its wildcard listeners never collide, and is reached through the
Service proxy (``kubesim.kubelet.proxy``) and its probes.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import urllib.parse
from collections.abc import Callable
from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import objects as o
from kubesim.controllers.informer import Informer
from kubesim.kubelet import containers
from kubesim.kubelet.forkserver import ForkServer
from kubesim.kubelet.images import ImageMap
from kubesim.kubelet.pods import PodContext, PodWorker
from kubesim.kubelet.startslots import StartSlots
from kubesim.timing import Timing

Obj = dict[str, Any]
log = logging.getLogger(__name__)

#: Host environment variables handed to pod processes (a container does not inherit its host's
#: environment; these make local programs runnable at all).
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR")

_LIVE: set[PodWorker] = set()


@atexit.register
def _kill_leftovers() -> None:
    # Belt and braces: if the event loop dies without running our shutdown, no process survives us.
    for worker in list(_LIVE):
        worker.kill_now()


class Kubelet:
    def __init__(
        self,
        api: kc.KubeClient,
        *,
        pods: Informer,
        timing: Timing,
        image_map: ImageMap | None = None,
        root: pathlib.Path | None = None,
        nodes: tuple[str, ...] = ("kubesim-node-0", "kubesim-node-1", "kubesim-node-2"),
        extra_env: dict[str, str] | None = None,
        services: Informer | None = None,
        mount_namespaces: bool | None = None,
    ) -> None:
        self._api = api
        self._pods = pods
        self._timing = timing
        self._nodes = nodes
        self._node_cycle = itertools.cycle(nodes)
        self._owns_root = root is None
        self._root = root or pathlib.Path(tempfile.mkdtemp(prefix="kubesim-pods-", dir=_scratch_dir()))
        base_env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        base_env.setdefault("PATH", os.defpath)
        base_env["KUBESIM_PYTHON"] = sys.executable
        # What in-cluster client configuration reads (with the mounted token and CA).
        api_url = urllib.parse.urlsplit(api.url)
        base_env["KUBERNETES_SERVICE_HOST"] = api_url.hostname or "127.0.0.1"
        base_env["KUBERNETES_SERVICE_PORT"] = str(api_url.port or 443)
        base_env["KUBERNETES_SERVICE_PORT_HTTPS"] = base_env["KUBERNETES_SERVICE_PORT"]
        base_env.update(extra_env or {})
        if mount_namespaces is None:
            # Mount namespaces need CAP_SYS_ADMIN; KUBESIM_MOUNT_NAMESPACES=0 turns them off.
            mount_namespaces = os.geteuid() == 0 and os.environ.get("KUBESIM_MOUNT_NAMESPACES", "1") != "0"
        self._services = services
        self._ctx = PodContext(
            api=api,
            image_map=image_map or ImageMap(),
            timing=timing,
            root=self._root,
            base_env=base_env,
            mount_namespaces=mount_namespaces,
            services=(lambda: services.items()) if services is not None else (lambda: []),
            netns_ready=lambda worker: self._netns_changed(),
            start_slots=StartSlots(timing.max_parallel_pod_starts),
            fork_server=self._fork_server,
        )
        #: Called when a pod network namespace appears or goes (the Service proxy listens in them).
        self.on_netns_change: list[Callable[[], None]] = []
        self._workers: dict[str, PodWorker] = {}
        self._fork_servers: dict[tuple[str, ...], ForkServer] = {}
        self._base_env = base_env
        self._scheduling: set[str] = set()
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self._ips = (f"127.1.{n // 250}.{n % 250 + 2}" for n in itertools.count())
        self._bind_subresource = True
        self._scheduler_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        pods.add_handler(self._on_pod)
        if services is not None:
            services.add_handler(self._on_service)

    def _fork_server(self, preload: tuple[str, ...]) -> ForkServer:
        if preload not in self._fork_servers:
            self._fork_servers[preload] = ForkServer(preload, env=self._base_env)
        return self._fork_servers[preload]

    def _netns_changed(self) -> None:
        for callback in self.on_netns_change:
            callback()

    def pod_namespaces(self) -> dict[str, str]:
        """Pod IP → network namespace path, for the running pods that have their own."""
        return {w.ip: w.netns for w in self._workers.values() if w.netns is not None and not w.stopping}

    def _on_service(self, etype: str, svc: Obj, old: Obj | None) -> None:
        # Pods' hosts files list every Service's cluster DNS names.
        for worker in list(self._workers.values()):
            worker.write_hosts()

    async def register_nodes(self) -> None:
        """Create a Ready Node object per simulated node, as a kubelet registers itself."""
        for name in self._nodes:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
                "spec": {},
            }
            try:
                await self._api.create(kc.NODES, None, body)
            except kc.ApiError as exc:
                if not exc.already_exists:
                    raise
            now = o.rfc3339(o.now())
            status = {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                "capacity": {"cpu": "64", "memory": "256Gi", "pods": "10000"},
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "10000"},
                "nodeInfo": {"kubeletVersion": "kubesim", "operatingSystem": "linux", "architecture": "amd64"},
            }
            await self._api.patch(kc.NODES, None, name, {"status": status}, sub="status")

    @property
    def root(self) -> pathlib.Path:
        return self._root

    @property
    def nodes(self) -> tuple[str, ...]:
        """The simulated nodes this kubelet runs."""
        return self._nodes

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        uid = o.uid_of(pod)
        if etype == "DELETED":
            self._scheduling.discard(uid)
            worker = self._workers.pop(uid, None)
            if worker is not None and uid not in self._stopping:
                self._stop(uid, worker, grace=0.0, delete=False)
            return
        node = pod.get("spec", {}).get("nodeName")
        if not node:
            if uid not in self._scheduling and not o.is_deleting(pod):
                self._scheduling.add(uid)
                self._spawn(self._schedule(pod))
            return
        if node not in self._nodes:
            return
        worker = self._workers.get(uid)
        if o.is_deleting(pod):
            if worker is None:
                self._spawn(self._finish_delete(pod))
            elif uid not in self._stopping:
                self._stop(uid, worker, grace=_grace(pod), delete=True)
            return
        phase = pod.get("status", {}).get("phase")
        if worker is None and phase not in ("Succeeded", "Failed"):
            worker = PodWorker(self._ctx, pod, node=node, ip=next(self._ips))
            self._workers[uid] = worker
            _LIVE.add(worker)
            worker.start()
        elif worker is not None:
            worker.pod = pod

    async def _schedule(self, pod: Obj) -> None:
        # One scheduling decision at a time, each taking the scheduling delay: like kube-scheduler's
        # single queue, this caps throughput (~70 pods/s upstream at the default ~15 ms).
        async with self._scheduler_lock:
            await asyncio.sleep(self._timing.scheduling_delay)
        ns, name = o.namespace_of(pod), o.name_of(pod)
        node = next(self._node_cycle)
        try:
            if self._bind_subresource:
                body = {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name, "namespace": ns},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                }
                try:
                    await self._api.request("POST", kc.PODS.path(ns, name, "binding"), body=body)
                    return
                except kc.ApiError as exc:
                    # A 404 is the pod gone (deleted while queued: the cache lags) far more often
                    # than a server without Binding; only a pod the server still has says the latter.
                    if not (exc.status == 405 or (exc.status == 404 and await self._still_exists(ns, name))):
                        raise
                    self._bind_subresource = False  # no Binding support: set nodeName directly
            patch = {"metadata": {"uid": o.uid_of(pod)}, "spec": {"nodeName": node}}
            await self._api.patch(kc.PODS, ns, name, patch)
        except kc.ApiError as exc:
            if not (exc.not_found or exc.status == 409):
                log.warning("scheduling %s/%s failed: %s", ns, name, exc)
        finally:
            self._scheduling.discard(o.uid_of(pod))

    async def _still_exists(self, ns: str, name: str) -> bool:
        try:
            await self._api.get(kc.PODS, ns, name)
        except kc.ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def _stop(self, uid: str, worker: PodWorker, *, grace: float, delete: bool) -> None:
        async def stop() -> None:
            try:
                await worker.stop(grace)
                if delete:
                    await self._finish_delete(worker.pod)
            finally:
                _LIVE.discard(worker)
                self._workers.pop(uid, None)
                self._stopping.pop(uid, None)
                if worker.netns is not None:
                    self._netns_changed()

        task = asyncio.create_task(stop())
        self._stopping[uid] = task

    async def _finish_delete(self, pod: Obj) -> None:
        try:
            await self._api.delete(kc.PODS, o.namespace_of(pod), o.name_of(pod), uid=o.uid_of(pod), grace_period=0)
        except kc.ApiError as exc:
            if not (exc.not_found or exc.status == 409):
                raise

    async def aclose(self) -> None:
        """Kill every process started (no grace: the cluster is going away) and clean up."""
        for task in list(self._tasks):
            task.cancel()
        stops = list(self._stopping.values())
        workers = list(self._workers.values())
        await asyncio.gather(*(w.stop(0.0) for w in workers), return_exceptions=True)
        for task in stops:
            task.cancel()
        await asyncio.gather(*stops, *self._tasks, return_exceptions=True)
        for worker in workers:
            _LIVE.discard(worker)
        self._workers.clear()
        await asyncio.gather(*(server.aclose() for server in self._fork_servers.values()), return_exceptions=True)
        # A stop cancelled above killed its pod's helpers without waiting: their exits before the loop goes.
        await containers.reap_killed()
        if self._owns_root:
            shutil.rmtree(self._root, ignore_errors=True)


def _scratch_dir() -> str | None:
    """Where pod directories go: the host's tmpfs when it has one. Each pod start makes a dozen
    directories, files and symlinks and its end removes them, on the kubelet's event loop; on a
    busy disk a mkdir took ~2 ms (against 0.03 ms on tmpfs), tens of ms per pod."""
    shm = "/dev/shm"
    try:
        usable = os.access(shm, os.W_OK | os.X_OK) and not os.statvfs(shm).f_flag & os.ST_NOEXEC
    except OSError:
        usable = False
    return shm if usable else None  # (volumes may hold programs a container runs: not noexec)


def _grace(pod: Obj) -> float:
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    value = meta.get("deletionGracePeriodSeconds")
    if value is None:
        value = spec.get("terminationGracePeriodSeconds", 30)
    return float(value)
