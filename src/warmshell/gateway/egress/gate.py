"""Where a sandbox's egress policy meets its activation: the policy composed from the gateway's
`[network]` config, the serving pool's profile and the request; its proxy socket opened in the
directory the driver bound into the sandbox; the proxy variables, and placeholders in place of
host-bound secrets, its workload gets. Applied here, outside the sandbox, so a warm member serves
any policy; closed when the sandbox ends."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import quote

from warmshell.core import egress, phases
from warmshell.core.config import NetworkConfig
from warmshell.core.egress import Policy, trust_environment
from warmshell.core.ids import Fingerprint, SandboxId
from warmshell.core.models import Condition, SandboxRecord
from warmshell.drivers.base import PoolView
from warmshell.gateway.egress import interception, placeholders
from warmshell.gateway.egress.credentials import Presented, ProxyCredentials
from warmshell.gateway.egress.proxy import Admitted, EgressProxy
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.secretvault import SecretVault
from warmshell.sandboxio import trust

__all__ = [
    "NETWORK_CONDITION",
    "Attachment",
    "EgressGate",
    "EgressTrust",
    "HostsEgressSockets",
    "NetworkProxy",
    "proxy_environment",
]

NETWORK_CONDITION = "Network"


@runtime_checkable
class HostsEgressSockets(Protocol):
    """A driver that binds a directory of the gateway's into each sandbox (the local driver)."""

    def egress_socket(self, instance_id: str) -> Path | None:
        """Where the proxy's socket for this instance goes (None: it has no such directory)."""
        ...

    def share_authority(self, certificate_pem: bytes) -> None:
        """Blocking, once at the gateway's start: the CA and the bundle of the host's CAs and it
        placed where every sandbox on the host's root reads them (`egress.SHARED_TRUST_DIR`), to
        which an intercepting activation links its egress directory's names."""
        ...


def proxy_environment(url: str = f"http://127.0.0.1:{egress.PROXY_PORT}") -> dict[str, str]:
    """The variables that send pip, git, curl, npm, urllib, requests, httpx (and Node ≥ 24 with
    NODE_USE_ENV_PROXY) through the sandbox's proxy (`url`, credentials included)."""
    env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
    env |= {name.lower(): url for name in env}
    env |= {"NO_PROXY": "localhost,127.0.0.1", "no_proxy": "localhost,127.0.0.1", "NODE_USE_ENV_PROXY": "1"}
    return env


@dataclass(frozen=True)
class EgressTrust:
    """Read before the gateway is built: the CA that intercepts TLS for placeholder secrets
    (None: such tunnels pass untouched), and the context upstreams are verified with."""

    authority: interception.CertificateAuthority | None = None
    upstream_tls: ssl.SSLContext | None = None


@dataclass(frozen=True)
class NetworkProxy:
    """The proxy as pods reach it (Kubernetes): the URL they are given (`[network] proxy_url`),
    the credentials they present there, and what the proxy needs to admit a connection on any
    replica: the sandbox's record and its sealed secrets, both in the shared store."""

    url: str
    credentials: ProxyCredentials
    records: SandboxRecords
    vault: SecretVault

    def url_for(self, sandbox_id: str, credential: str) -> str:
        """The proxy URL with the sandbox's credential as its user info."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{quote(sandbox_id, safe='')}:{quote(credential, safe='')}@{rest}"


@dataclass(frozen=True)
class Attachment:
    """What a workload gets at activation: environment to add, its secrets as it sees them, and
    the CA it is to trust when its supervisor places that itself (a pod's; b"" else)."""

    environment: dict[str, str]
    secrets: dict[str, str] = field(repr=False)
    trusted_ca: bytes = b""


# What an intercepting activation relinks in the egress directory: its system bundle, into the
# shared trust of the sandbox's staged /etc. The files `trust_environment()` names are linked there
# already, when the sandbox started (`etcstage.link_system_bundle`, `egress.TRUST_LINKS`).
_SHARED_BUNDLE = f"{egress.SHARED_TRUST_DIR}/{egress.BUNDLE_FILE}"
# What they name, made once: every intercepting activation adds them to its environment.
_TRUST_ENVIRONMENT = trust_environment()


def _link_shared_trust(directory: str) -> bool:
    """Relink the egress directory's system bundle into the staged /etc's shared trust; False
    (nothing done) when its sandbox's /etc is not the staged one (no system bundle link there)."""
    return trust.relink(directory, egress.SYSTEM_BUNDLE_COPY, _SHARED_BUNDLE)


def _copy_trust(authority: interception.CertificateAuthority, directory: Path) -> None:
    """Copies of the CA and the bundle in the egress directory of a sandbox whose /etc is not
    the staged one (an image's; blocking), readable by its uid: the state directory's own stay
    private (a link would share their mode)."""
    for source in (authority.ca_file, authority.bundle_file):
        target = directory / source.name
        if not target.exists():
            shutil.copyfile(source, target)
            os.chmod(target, 0o644)


class EgressGate:
    """Owned by the gateway: `attach` at each activation, `observe` every written record."""

    def __init__(
        self,
        config: NetworkConfig,
        proxy: EgressProxy,
        sockets: HostsEgressSockets | None,
        *,
        pools: Callable[[], Sequence[PoolView]] = tuple,
        authority: interception.CertificateAuthority | None = None,
        network: NetworkProxy | None = None,
    ) -> None:
        """`pools`: the driver's pools, whose profiles' `[network]` rules apply to the members
        they serve; `network`: the proxy as pods reach it, for a driver without sockets."""
        self._config = config
        self._network = network
        self._proxy = proxy
        self._sockets = sockets
        self._pools = pools
        self._authority = authority
        self._deny = egress.parse_rules(config.deny, field="network.deny")
        # What a sandbox gets when neither a pool's profile nor its request has rules (every
        # cold create without --allow-net): composed once, not at each activation.
        self._gateway_policy = egress.compose(
            default=config.default, gateway_deny=self._deny, requests_may_widen=config.requests_may_widen
        )
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def proxy(self) -> EgressProxy:
        """The proxy (its decisions, for ListEgress)."""
        return self._proxy

    def policy(self, record: SandboxRecord, pool: Fingerprint | None = None) -> Policy:
        """The sandbox's policy: the gateway's default and deny list, the profile of the pool
        that serves it (`pool`: the fingerprint of the member it was given; None: the pool its
        record names, if any), narrowed by its request."""
        return self._policy(record, self._view(record, pool))

    def _policy(self, record: SandboxRecord, view: PoolView | None) -> Policy:
        request = record.spec.network
        if view is None and not request.allow and not request.deny:
            return self._gateway_policy
        profile_allow = view.network_allow if view is not None else None
        profile_deny = view.network_deny if view is not None else ()
        return egress.compose(
            default=self._config.default,
            gateway_deny=self._deny,
            profile_allow=egress.parse_rules(profile_allow, field="network.allow")
            if profile_allow is not None
            else None,
            profile_deny=egress.parse_rules(profile_deny, field="network.deny"),
            request_allow=egress.parse_rules(request.allow, field="spec.network.allow") if request.allow else None,
            request_deny=egress.parse_rules(request.deny, field="spec.network.deny"),
            requests_may_widen=self._config.requests_may_widen,
        )

    def _view(self, record: SandboxRecord, pool: Fingerprint | None) -> PoolView | None:
        """The pool that serves the sandbox: the one of the member it was given (`pool`), else
        the one its record names (by name: a pod's proxy connections and a supervisor that
        registered again after its claim); None for a cold create, whose record names no pool
        (no pool's views are made for it)."""
        name = record.status.pool
        if pool is None and not name:
            return None
        for view in self._pools():
            if view.workspace == record.workspace and (view.fingerprint == pool if pool else view.name == name):
                return view
        return None

    def secret_hosts(self, record: SandboxRecord, pool: Fingerprint | None) -> dict[str, list[str]]:
        """Each secret's hosts: the request's, else its pool profile's `[activation] secret_hosts`."""
        return self._secret_hosts(record, self._view(record, pool))

    @staticmethod
    def _secret_hosts(record: SandboxRecord, view: PoolView | None) -> dict[str, list[str]]:
        profile = {name: list(hosts) for name, hosts in (view.secret_hosts if view is not None else {}).items()}
        return profile | dict(record.spec.secret_hosts)

    async def attach(
        self,
        record: SandboxRecord,
        instance_id: str,
        pool: Fingerprint | None,
        secrets: Mapping[str, str],
        *,
        source: str = "",
    ) -> Attachment:
        """Open the sandbox's proxy socket when its policy allows anything (its connections from
        before, if any, cut); what its workload then gets: the proxy variables (none without a
        proxy) and its secrets, a placeholder in place of each that names hosts. `source`: the
        IP address its supervisor registered from, to which a pod's credential is bound."""
        # Every activation passes here, warm or cold, and most sandboxes have no egress: the
        # pool's view is looked up once, secret hosts only for secrets, and a sandbox whose
        # policy allows nothing gets no socket path at all (30 -> 16 us per warm create and
        # 30 -> 2 us per cold one, unprofiled; cProfile had put it near a third of a millisecond).
        view = self._view(record, pool)
        policy = self._policy(record, view)
        hosts = self._secret_hosts(record, view) if secrets else {}
        if self._sockets is None and self._network is not None:
            return self._attach_network(record, policy, secrets, hosts, source)
        made = placeholders.make(secrets, hosts)
        workload_secrets = dict(secrets) | {placeholder.name: placeholder.token for placeholder in made}
        path = (
            self._sockets.egress_socket(instance_id) if self._sockets is not None and policy.allows_anything else None
        )
        if path is None:
            await self._proxy.close(record.id)
            return Attachment({}, workload_secrets)
        await self._proxy.open(record.id, path, policy, made)
        environment = proxy_environment()
        if made and self._authority is not None:
            # Its hosts' TLS is intercepted: the sandbox trusts the gateway's CA (and the host's).
            await self._trust(self._authority, os.path.dirname(path))
            environment |= _TRUST_ENVIRONMENT
        return Attachment(environment, workload_secrets)

    @staticmethod
    async def _trust(authority: interception.CertificateAuthority, directory: str) -> None:
        """The gateway's CA into the trust of the sandbox whose egress directory is `directory`.
        One with the link to the host's bundle there (`etcstage.link_system_bundle`) reads the
        staged /etc, where the CA is placed once per gateway (`share_authority`): its system bundle
        is relinked there, on the loop (23 us of CPU hot on ext4; its two other names were linked at
        its start; copying the CA and the ~220 KB bundle in took ~0.4 ms and a thread hop); the link
        it had is replaced, never written through (it leads to the host's bundle every other
        sandbox reads)."""
        if not _link_shared_trust(directory):
            await asyncio.to_thread(_copy_trust, authority, Path(directory))

    def _attach_network(
        self,
        record: SandboxRecord,
        policy: Policy,
        secrets: Mapping[str, str],
        hosts: Mapping[str, Sequence[str]],
        source: str,
    ) -> Attachment:
        """A pod's attachment: a fresh credential in the proxy URL, placeholders derived from it
        (so any replica's proxy makes the same ones again), and, when it has some, the CA that
        intercepts their hosts' TLS (the same on every replica) for its supervisor to place."""
        assert self._network is not None
        network = self._network
        credential = network.credentials.issue(record.id, source)
        nonce = network.credentials.verify(record.id, credential, source)
        assert nonce is not None
        made = placeholders.make(secrets, hosts, lambda name: network.credentials.placeholder(record.id, nonce, name))
        workload_secrets = dict(secrets) | {placeholder.name: placeholder.token for placeholder in made}
        if not policy.allows_anything:
            return Attachment({}, workload_secrets)
        authority = self._authority.certificate_pem if made and self._authority is not None else b""
        return Attachment(proxy_environment(network.url_for(record.id, credential)), workload_secrets, authority)

    async def admit(self, shown: Presented) -> Admitted | None:
        """What a pod's connection to the proxy may do: its sandbox's policy and placeholders,
        when its credential was issued for that sandbox and the sandbox is live (read from the
        store on every connection, so a deleted sandbox's credential buys nothing on any replica)."""
        network = self._network
        if network is None:
            return None
        nonce = network.credentials.verify(shown.sandbox_id, shown.credential, shown.source)
        if nonce is None:
            return None
        record = await network.records.get(SandboxId(shown.sandbox_id))
        if record is None or record.status.phase in phases.TERMINAL:
            return None
        secrets = await network.vault.get(record.id) if record.spec.secret_names else {}
        made = placeholders.make(
            secrets,
            self.secret_hosts(record, None),
            lambda name: network.credentials.placeholder(record.id, nonce, name),
        )
        return Admitted(self.policy(record, None), tuple(made))

    def condition(self, record: SandboxRecord) -> Condition | None:
        """The `Network` condition: what the sandbox may reach (the policy its proxy applies);
        on a driver without egress sockets, only for a request that asked for rules or
        placeholders (None else)."""
        if self._sockets is None and self._network is not None:
            composed = self.policy(record, None)
            if not composed.allows_anything:
                return Condition(type=NETWORK_CONDITION, status="False", reason="NoEgress", message="no egress")
            message = f"through the gateway's proxy ({self._network.url}): {composed.summary}"
            return Condition(type=NETWORK_CONDITION, status="True", reason="Proxy", message=message)
        if self._sockets is None:
            if not (record.spec.network.allow or record.spec.network.deny or record.spec.secret_hosts):
                return None
            message = "this driver does not apply egress policies nor swap placeholder secrets (the local driver does)"
            return Condition(type=NETWORK_CONDITION, status="Unknown", reason="Unsupported", message=message)
        policy = self._proxy.policy(record.id)
        if policy is None:
            return Condition(type=NETWORK_CONDITION, status="False", reason="NoEgress", message="loopback only")
        message = f"through the gateway's proxy: {policy.summary}"
        return Condition(type=NETWORK_CONDITION, status="True", reason="Proxy", message=message)

    def observe(self, record: SandboxRecord) -> None:
        """Records observer: a sandbox that ended or is being deleted loses its connections."""
        if record.status.phase in phases.TERMINAL and self._proxy.policy(record.id) is not None:
            task = asyncio.get_running_loop().create_task(self._proxy.close(record.id))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Cut every connection and wait for pending closes."""
        await asyncio.gather(*self._closing, return_exceptions=True)
        await self._proxy.aclose()
