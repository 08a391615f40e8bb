"""``ApiServer``: the pieces of the simulated API server wired into one aiohttp app on loopback."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from kubesim.apiserver import builtin_schemas, serviceaccounts, special, tls, tokens
from kubesim.apiserver.admin import Admin
from kubesim.apiserver.auth import AllowAll, Authenticator, Authorizer, User
from kubesim.apiserver.faults import Faults
from kubesim.apiserver.gc import Controllers
from kubesim.apiserver.handlers import Handler
from kubesim.apiserver.openapi import OpenApi
from kubesim.apiserver.rbac_authorizer import RbacAuthorizer, install_bootstrap_policy
from kubesim.apiserver.requestlog import RequestLog
from kubesim.apiserver.resources import Registry
from kubesim.apiserver.rest import Rest, WriteOptions
from kubesim.apiserver.store import Store

BOOTSTRAP_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
SYSTEM_MASTERS = ("system:masters", "system:authenticated")


@dataclass
class ServerConfig:
    """Knobs of one server; the defaults suit tests."""

    host: str = "127.0.0.1"
    port: int = 0
    window: int = 5000  # watch events retained per resource
    bookmark_interval: float = 5.0
    watch_timeout: float = 1800.0
    api_audiences: list[str] = field(default_factory=lambda: list(tokens.DEFAULT_AUDIENCES))
    user_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    username: str = "kubesim-user"
    admin_username: str = "kubesim-admin"
    namespaces: tuple[str, ...] = BOOTSTRAP_NAMESPACES
    # HTTPS by default: client-go (kubectl) never sends bearer tokens over plain HTTP.
    tls: bool = True
    # With TLS, a second listener on the same host speaking plain HTTP, for kubesim's controllers
    # and kubelet in another process (`kubesim controllers --via`, `internal_url`): TLS in Python's
    # asyncio was half the API server's CPU under warm creates and a sixth of the controllers'.
    # Tokens are checked the same way. (`kubesim serve` runs them in its own process instead.)
    internal_http: bool = False
    authorizer: Authorizer = field(default_factory=AllowAll)
    # Enforce RBAC (replaces ``authorizer``): only system:masters (the admin and default user
    # tokens) bypasses it; ServiceAccount tokens get what their bindings grant.
    rbac: bool = False


class ApiServer:
    """A simulated kube-apiserver. Use ``start()``/``stop()`` or ``kubesim.testing.running_apiserver``."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        cfg = self.config
        self.store = Store(window=cfg.window)
        self.registry = Registry()
        self.rest = Rest(self.store, self.registry)
        self.openapi = OpenApi(self.registry)
        self.issuer = tokens.TokenIssuer()
        self.users = {
            cfg.user_token: User(cfg.username, SYSTEM_MASTERS),
            cfg.admin_token: User(cfg.admin_username, SYSTEM_MASTERS),
        }
        self.authn = Authenticator(self.users, self.issuer, cfg.api_audiences)
        self.authn.sa_validator = special.live_uid(self.rest)
        self.authorizer: Authorizer = cfg.authorizer
        if cfg.rbac:
            rbac = RbacAuthorizer(self.store)
            self.authorizer = rbac
            self.rest.admission.append(rbac.admit)  # nobody grants what they do not hold
        self.rest.admission.append(serviceaccounts.admission(self.store))
        self.faults = Faults()
        self.log = RequestLog()
        self.admin = Admin(self)
        self.controllers: Controllers | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._internal_site: web.TCPSite | None = None
        self.internal_port = 0
        self._offline: asyncio.Task[None] | None = None
        self.port = cfg.port
        self.certificates = tls.generate((cfg.host, "localhost")) if cfg.tls else None

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bootstrap namespaces, start the built-in controllers and listen."""
        # The built-in schemas come from kubernetes_asyncio's models: load them off the event loop.
        await asyncio.to_thread(builtin_schemas.definitions)
        self.controllers = Controllers(self.rest)
        self.controllers.start()
        rt = self.registry.get("", "namespaces")
        assert rt is not None
        for ns in self.config.namespaces:
            if self.store.get("", "namespaces", "", ns) is None:
                body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                self.rest.create(rt, "v1", "", body, WriteOptions())
        if self.config.rbac:
            # Discovery, `kubectl auth can-i` and the health paths must keep working for everyone.
            install_bootstrap_policy(self.rest, self.registry)
        app = web.Application(client_max_size=3 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", Handler(self).__call__)
        # Cancel handlers when clients disconnect so abandoned watches unsubscribe at once.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        try:
            await self._listen()
        except BaseException:
            await self.stop()
            raise
        await self.controllers.wait_idle()

    async def _listen(self) -> None:
        assert self._runner is not None
        await self._runner.setup()
        await self._open_sites(self.config.port, 0)

    async def _open_sites(self, port: int, internal_port: int) -> None:
        ssl_context = self.certificates.server_context() if self.certificates else None
        self._site, self.port = await self._open_site(port, ssl_context)
        if self.certificates is not None and self.config.internal_http:
            self._internal_site, self.internal_port = await self._open_site(internal_port, None)

    async def _open_site(self, port: int, ssl_context: Any) -> tuple[web.TCPSite, int]:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.config.host, port, ssl_context=ssl_context)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        assert sockets, "the site did not bind a socket"
        return site, int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Close watches, stop listening and stop the controllers."""
        if self._offline is not None:
            self._offline.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._offline
        self.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.controllers is not None:
            await self.controllers.stop()

    async def wait_idle(self) -> None:
        """Wait until the built-in controllers (GC, namespaces) have caught up."""
        if self.controllers is not None:
            await self.controllers.wait_idle()

    # ---- addresses and credentials -----------------------------------------------------------

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>`` (``http://`` when TLS is off)."""
        scheme = "https" if self.certificates else "http"
        return f"{scheme}://{self.config.host}:{self.port}"

    @property
    def internal_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the plain-HTTP listener for kubesim's own components
        ("" without one: ``ServerConfig.internal_http``, TLS on)."""
        return f"http://{self.config.host}:{self.internal_port}" if self._internal_site or self.internal_port else ""

    @property
    def user_token(self) -> str:
        """Bearer token of the default user (what warmshell uses)."""
        return self.config.user_token

    @property
    def admin_token(self) -> str:
        """Bearer token of the controllers' admin user."""
        return self.config.admin_token

    def kubeconfig(self, *, admin: bool = False, namespace: str = "default") -> dict[str, Any]:
        """A kubeconfig dict for the user (or admin) token."""
        user = "kubesim-admin" if admin else "kubesim-user"
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kubesim", "cluster": self._cluster_entry()}],
            "users": [{"name": user, "user": {"token": self.admin_token if admin else self.user_token}}],
            "contexts": [{"name": "kubesim", "context": {"cluster": "kubesim", "user": user, "namespace": namespace}}],
            "current-context": "kubesim",
            "preferences": {},
        }

    def _cluster_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"server": self.url}
        if self.certificates is not None:
            entry["certificate-authority-data"] = base64.b64encode(self.certificates.ca_pem).decode()
        return entry

    def write_kubeconfig(self, path: str | Path, *, admin: bool = False) -> Path:
        """Write ``kubeconfig()`` to ``path`` (mode 0600) and return the path.

        Written whole under a temporary name, then renamed: a client polling for the file (a test,
        a script waiting for the cluster) never reads it half-written, and the token in it is never
        readable under the umask's mode, not even for the moment before a chmod."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        staged = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                fd = -1
                os.fchmod(out.fileno(), 0o600)
                out.write(yaml.safe_dump(self.kubeconfig(admin=admin), sort_keys=False))
            os.replace(staged, p)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            staged.unlink(missing_ok=True)
            raise
        return p

    # ---- fault helpers -----------------------------------------------------------------------

    def close_watches(self, resource: str | None = None) -> int:
        """End open watches (all, or of one plural); clients see the stream end and re-watch."""
        subs = [
            s
            for s in self.store.subscribers()
            if resource is None
            or any(
                s in self.store.bucket(rt.group, rt.plural).subscribers
                for rt in self.registry.all()
                if rt.plural == resource
            )
        ]
        for s in subs:
            s.close()
        return len(subs)

    async def go_offline(self, seconds: float) -> None:
        """Refuse connections for ``seconds``, dropping open ones, as during an API server restart.

        Returns once the listener is closed; the same port opens again in the background.
        """
        if self._site is None or self._runner is None:
            return
        await self._site.stop()
        self._site = None
        if self._internal_site is not None:
            await self._internal_site.stop()
            self._internal_site = None
        self.close_watches()
        web_server = self._runner.server
        for conn in list(web_server.connections if web_server is not None else ()):
            conn.force_close()
        self._offline = asyncio.get_running_loop().create_task(self._come_back(seconds))

    async def _come_back(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self._open_sites(self.port, self.internal_port)
        self._offline = None

    @property
    def online(self) -> bool:
        """Whether the server is listening (false while ``go_offline`` is in effect)."""
        return self._site is not None

    def compact(self) -> None:
        """Forget the event history: watches resumed from any earlier resourceVersion get 410."""
        self.store.compact()
