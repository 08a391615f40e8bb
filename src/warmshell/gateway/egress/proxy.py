"""The egress proxy: one listening Unix socket per sandbox, opened at activation in a directory
bound into that sandbox alone, so the socket a connection came through says whose it is (no
header the workload could forge); the sandbox's agent hands its first TCP connection made
inside and then its listener to it there, and the proxy accepts the next ones itself
(`handoff`). Each connection is one HTTP CONNECT tunnel or one plain
HTTP request in absolute form; the proxy resolves the name itself and checks the sandbox's
policy on the name and port, then on the address it connects to (see `warmshell.core.egress`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from warmshell.core import egress
from warmshell.core.config import NetworkConfig
from warmshell.core.egress import Decision, Policy
from warmshell.core.errors import FailedPreconditionError
from warmshell.gateway import metrics
from warmshell.gateway.egress import credentials, handoff, heads, interception, placeholders, splicing
from warmshell.gateway.egress.pumping import CHUNK, TokenBucket, copy_body, pump

__all__ = ["Admit", "Admitted", "EgressEntry", "EgressProxy", "host_local"]

log = logging.getLogger(__name__)
_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

_REASONS = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests", 431: "Request Header Fields Too Large"}
_REASONS |= {407: "Proxy Authentication Required", 502: "Bad Gateway", 504: "Gateway Timeout"}
# After a refusal, what of the rest of a request is read and dropped so the answer arrives.
_LINGER_BYTES = 4 * 1024 * 1024
_LINGER_SECONDS = 1.0
_INTERCEPTED = " (TLS intercepted for its secrets)"
# Hand-off channels served at once per sandbox: its agent keeps one (a second while a
# replaced socket's is noticed).
_CHANNELS = 4


@dataclass
class EgressEntry:
    """One decision of the proxy, as `warmshell sandbox egress` lists it."""

    time_ms: int
    host: str
    port: int
    allowed: bool
    rule: str
    reason: str
    bytes_up: int = 0
    bytes_down: int = 0


def host_local(address: egress.Address) -> bool:
    """Whether `address` is one of this host's own (the kernel lets a socket bind only to
    those): the gateway's public interfaces are as off-limits as its loopback."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class Admitted:
    """What a network connection's credential bought: its sandbox's policy and placeholders."""

    policy: Policy
    placeholders: tuple[placeholders.Placeholder, ...] = ()


# Checks a presented credential (None: refused) — see `EgressGate.admit`.
Admit = Callable[[credentials.Presented], Awaitable[Admitted | None]]
_PROXY_AUTH = 'Proxy-Authenticate: Basic realm="warmshell-egress"\r\n'


@dataclass(eq=False)
class _Sandbox:
    """One sandbox's listener, its open connections and its decisions."""

    sandbox_id: str
    policy: Policy
    path: Path | None  # None: reached over the network (`EgressProxy.listen`), no socket of its own
    entries: deque[EgressEntry]
    up: TokenBucket
    down: TokenBucket
    placeholders: tuple[placeholders.Placeholder, ...] = ()
    server: handoff.Listener | None = None
    connections: set[asyncio.Task[None]] = field(default_factory=set)
    # Every byte through its connections, up (out of the sandbox) and down, while the sandbox lives.
    bytes_up: int = 0
    bytes_down: int = 0


class EgressProxy:
    """Owned by the gateway: `open` a sandbox's socket at activation, `close` it at its end."""

    def __init__(
        self,
        config: NetworkConfig,
        *,
        authority: interception.CertificateAuthority | None = None,
        upstream_tls: ssl.SSLContext | None = None,
        peer: handoff.PeerCheck = handoff.is_sandbox_agent,
    ) -> None:
        """`authority`: the CA that intercepts TLS to the hosts of placeholder secrets (None:
        such tunnels pass untouched, unswapped); `upstream_tls` verifies those upstreams; `peer`:
        who may hand a sandbox's connections over (its agent)."""
        self._config = config
        self._authority = authority
        self._upstream_tls = upstream_tls or (interception.upstream_context("") if authority else None)
        self._sandboxes: dict[str, _Sandbox] = {}
        self._listener: asyncio.Server | None = None
        self._network: set[asyncio.Task[None]] = set()  # every network connection, admitted or not
        self._peer: handoff.PeerCheck = peer

    def policy(self, sandbox_id: str) -> Policy | None:
        """The policy a sandbox's proxy applies now (None: it has none open)."""
        sandbox = self._sandboxes.get(sandbox_id)
        return sandbox.policy if sandbox is not None else None

    def socket_path(self, sandbox_id: str) -> Path | None:
        """Where the sandbox's proxy socket is (None: it has none open here)."""
        sandbox = self._sandboxes.get(sandbox_id)
        return sandbox.path if sandbox is not None else None

    def traffic(self, sandbox_id: str) -> tuple[int, int] | None:
        """Bytes up (out of the sandbox) and down through its proxy so far; None: no proxy here."""
        sandbox = self._sandboxes.get(sandbox_id)
        return (sandbox.bytes_up, sandbox.bytes_down) if sandbox is not None else None

    def decisions(self, sandbox_id: str) -> list[EgressEntry]:
        """Its latest decisions, oldest first (what this gateway kept: a bounded ring)."""
        sandbox = self._sandboxes.get(sandbox_id)
        return list(sandbox.entries) if sandbox is not None else []

    async def open(
        self, sandbox_id: str, path: Path, policy: Policy, secrets: Sequence[placeholders.Placeholder] = ()
    ) -> None:
        """Listen for the sandbox at `path` (its connections, and a socket there, replaced),
        swapping its placeholder `secrets`; FailedPreconditionError when the socket cannot be made."""
        old = self._sandboxes.get(sandbox_id)
        entries: deque[EgressEntry] = deque(old.entries if old else (), maxlen=self._config.log_entries)
        await self.close(sandbox_id, keep_log=True)
        rate = self._config.max_bytes_per_second
        sandbox = _Sandbox(sandbox_id, policy, path, entries, TokenBucket(rate), TokenBucket(rate), tuple(secrets))
        if old is not None:
            sandbox.bytes_up, sandbox.bytes_down = old.bytes_up, old.bytes_down
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        try:
            accept = functools.partial(self._accept, sandbox)
            sandbox.server = handoff.Listener(path, accept, channels=_CHANNELS, peer=self._peer)
        except OSError as exc:
            self._sandboxes.pop(sandbox_id, None)  # what it had before is closed: no policy applies
            raise FailedPreconditionError(f"cannot open the egress proxy's socket {path}: {exc}") from exc
        self._sandboxes[sandbox_id] = sandbox

    async def close(self, sandbox_id: str, *, keep_log: bool = False) -> None:
        """Stop listening for the sandbox and cut its open connections."""
        sandbox = self._sandboxes.pop(sandbox_id, None) if not keep_log else self._sandboxes.get(sandbox_id)
        if sandbox is None:
            return
        server, sandbox.server = sandbox.server, None
        await _cut(server, sandbox.connections)
        if sandbox.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(sandbox.path)

    async def aclose(self) -> None:
        """Close every sandbox's socket and connection, and the network listener."""
        listener, self._listener = self._listener, None
        await _cut(listener, self._network)
        for sandbox_id in list(self._sandboxes):
            await self.close(sandbox_id)

    async def listen(self, host: str, port: int, admit: Admit) -> int:
        """Serve sandboxes that reach the proxy over the network (pods), each connection
        admitted by the credential it presents; the port listened on. FailedPreconditionError
        when it cannot listen."""
        try:
            self._listener = await asyncio.start_server(
                lambda r, w: self._accept_remote(admit, r, w), host, port, limit=self._config.max_header_bytes
            )
        except OSError as exc:
            raise FailedPreconditionError(f"cannot listen for egress on {host}:{port}: {exc}") from exc
        return int(self._listener.sockets[0].getsockname()[1])

    def _accept_remote(self, admit: Admit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve_remote(admit, reader, writer))
        self._network.add(task)
        task.add_done_callback(self._network.discard)

    async def _serve_remote(self, admit: Admit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One network connection: its head names the sandbox by its credential; past that it
        is that sandbox's connection like any through its socket (counted, cut at its end)."""
        try:
            head = await self._read_head(reader, writer)
            if head is None:
                return
            peer = writer.get_extra_info("peername")
            source = credentials.source_address(str(peer[0])) if isinstance(peer, tuple) else ""
            shown = credentials.presented(head, source)
            admitted = await admit(shown) if shown is not None else None
            if shown is None or admitted is None:
                metrics.EGRESS_CONNECTIONS.labels(verdict="unauthenticated").inc()
                refusal = _response(407, "a valid proxy credential of a live sandbox is required", _PROXY_AUTH)
                await _refuse(reader, writer, refusal)
                return
            sandbox = self._remote(shown.sandbox_id, admitted)
            task = asyncio.current_task()
            assert task is not None
            if len(sandbox.connections) >= self._config.max_connections:
                metrics.EGRESS_CONNECTIONS.labels(verdict="refused").inc()
                await _refuse(reader, writer, _response(429, "too many connections from this sandbox"))
                return
            sandbox.connections.add(task)
            try:
                await self._forward(sandbox, head, reader, writer)
            finally:
                sandbox.connections.discard(task)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _remote(self, sandbox_id: str, admitted: Admitted) -> _Sandbox:
        """The sandbox's state on this proxy, its policy and placeholders as just admitted."""
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            rate = self._config.max_bytes_per_second
            entries: deque[EgressEntry] = deque(maxlen=self._config.log_entries)
            sandbox = _Sandbox(sandbox_id, admitted.policy, None, entries, TokenBucket(rate), TokenBucket(rate))
            self._sandboxes[sandbox_id] = sandbox
        sandbox.policy, sandbox.placeholders = admitted.policy, admitted.placeholders
        return sandbox

    def _accept(self, sandbox: _Sandbox, connection: socket.socket) -> None:
        """A connection its agent handed over (a checked, non-blocking TCP socket)."""
        if len(sandbox.connections) >= self._config.max_connections:
            # Refused before anything is read: a flood costs the gateway a receive and a close.
            metrics.EGRESS_CONNECTIONS.labels(verdict="refused").inc()
            with contextlib.suppress(OSError):
                connection.send(_response(429, "too many connections from this sandbox"))
            connection.close()
            return
        task = asyncio.get_running_loop().create_task(self._serve(sandbox, connection))
        sandbox.connections.add(task)
        task.add_done_callback(sandbox.connections.discard)

    async def _serve(self, sandbox: _Sandbox, connection: socket.socket) -> None:
        try:
            reader, writer = await handoff.streams(connection, self._config.max_header_bytes)
        except OSError:
            connection.close()
            return
        except BaseException:  # cancelled (its sandbox closed) before a transport held it
            connection.close()
            raise
        try:
            head = await self._read_head(reader, writer)
            if head is not None:
                await self._forward(sandbox, head, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _read_head(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        parse: Callable[[bytes], heads.Head] = heads.parse_head,
    ) -> heads.Head | None:
        try:
            async with asyncio.timeout(self._config.connect_timeout_seconds):
                data = await reader.readuntil(b"\r\n\r\n")
            return parse(data)
        except asyncio.LimitOverrunError:
            problem = heads.BadRequest(431, f"request head over {self._config.max_header_bytes} bytes")
        except heads.BadRequest as exc:
            problem = exc
        except TimeoutError:
            problem = heads.BadRequest(400, "no complete request head in time")
        metrics.EGRESS_CONNECTIONS.labels(verdict="malformed").inc()
        await _refuse(reader, writer, _response(problem.status, problem.reason))
        return None

    async def _forward(
        self, sandbox: _Sandbox, head: heads.Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        entry = EgressEntry(int(time.time() * 1000), head.host, head.port, False, "", "")
        sandbox.entries.append(entry)
        decision, address = await self._decide(sandbox.policy, head)
        if address is not None and not head.tunnel:
            head, decision = _swapped(head, sandbox, decision)
        entry.allowed, entry.rule, entry.reason = decision.allowed, decision.rule, decision.describe()
        metrics.EGRESS_CONNECTIONS.labels(verdict="allowed" if decision.allowed else "denied").inc()
        if address is None or not decision.allowed:
            await _refuse(reader, writer, _response(403, f"egress to {head.host}:{head.port} {decision.describe()}"))
            return
        if (
            head.tunnel
            and self._authority is not None
            and any(p.for_host(head.host, head.port) for p in sandbox.placeholders)
        ):
            await self._intercept(sandbox, entry, head, address, (reader, writer))
            return
        upstream = await self._connect(entry, head, address, (reader, writer))
        if upstream is None:
            return
        if head.tunnel:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            _send_head(_Counters(entry, sandbox), upstream[1], head)
        await _splice(sandbox, entry, (reader, writer), upstream)

    async def _intercept(
        self, sandbox: _Sandbox, entry: EgressEntry, tunnel: heads.Head, address: egress.Address, inside: _Stream
    ) -> None:
        """A CONNECT to a host of a placeholder secret: TLS ends here (with a leaf of the
        gateway's CA), each request's placeholders are swapped, and a new TLS connection, its
        certificate verified, goes upstream (kept for the connection's further requests)."""
        assert self._authority is not None
        reader, writer = inside
        # The leaf before the 200: the client's ClientHello follows the 200 at once, and what
        # arrives before start_tls lands in the stream's buffer, where TLS never reads it (the
        # handshake then hung for its 60 s timeout when the leaf's thread hop came in between).
        context = await asyncio.to_thread(self._authority.server_context, tunnel.host)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.start_tls(context)
        parse = functools.partial(heads.parse_tunnelled_head, host=tunnel.host, port=tunnel.port)
        head = await self._read_head(reader, writer, parse)
        if head is None:
            return
        head, decision = _swapped(head, sandbox, Decision(entry.allowed, entry.rule))
        entry.allowed, entry.reason = decision.allowed, decision.describe() + _INTERCEPTED
        if not decision.allowed:
            await _refuse(reader, writer, _response(403, f"egress to {head.host}:{head.port} {decision.describe()}"))
            return
        upstream = await self._connect(entry, head, address, inside, tls=True)
        if upstream is None:
            return
        counters = _Counters(entry, sandbox)
        down = asyncio.create_task(pump(upstream[0], writer, sandbox.down, counters.down))
        requests = asyncio.create_task(_requests(sandbox, counters, head, parse, reader, upstream[1]))
        try:
            done, _ = await asyncio.wait({down, requests}, return_when=asyncio.FIRST_COMPLETED)
            refusal = requests.result() if requests in done else b""
            if refusal is None:  # the last request asked to close: its answer ends the connection
                await down
            down.cancel()
            if refusal:
                await _refuse(reader, writer, refusal)
        finally:
            for task in (down, requests):
                task.cancel()
            await asyncio.gather(down, requests, return_exceptions=True)
            upstream[1].close()

    async def _connect(
        self, entry: EgressEntry, head: heads.Head, address: egress.Address, inside: _Stream, *, tls: bool = False
    ) -> _Stream | None:
        """The upstream connection (None, the client answered 502, when it cannot be made)."""
        secure = {"ssl": self._upstream_tls, "server_hostname": head.host} if tls else {}
        try:
            async with asyncio.timeout(self._config.connect_timeout_seconds):
                return await asyncio.open_connection(str(address), head.port, **secure)  # type: ignore[arg-type]
        except (OSError, TimeoutError) as exc:
            entry.reason += f"; connecting failed: {exc}"
            await _refuse(*inside, _response(502, f"cannot connect to {head.host}:{head.port}: {exc}"))
            return None

    async def _decide(self, policy: Policy, head: heads.Head) -> tuple[Decision, egress.Address | None]:
        """The verdict, and the address to connect to when it allows."""
        decision = policy.check_name(head.host, head.port)
        if not decision.allowed:
            return decision, None
        try:
            found = await _addresses(head.host, head.port)
        except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA refuses ("a..b")
            return Decision(False, reason=f"cannot resolve {head.host}: {exc}"), None
        refusal = Decision(False, reason=f"{head.host} has no address")
        for address in found:
            verdict = policy.check_address(address, head.port, host_local=host_local(address))
            if verdict.allowed:
                return Decision(True, decision.rule or verdict.rule), address
            refusal = verdict
        return refusal, None


async def _addresses(host: str, port: int) -> list[egress.Address]:
    """What `host` resolves to: an IP literal is its own address, with no trip through the
    resolver's thread (a thread woken per connection waits its turn for a cpu on a loaded host:
    0.06 ms of CPU, and a run-queue wait, in every connection's setup); a name, getaddrinfo's."""
    if "%" not in host:  # a scoped IPv6 literal is left to getaddrinfo, as before
        with contextlib.suppress(ValueError):
            return [ipaddress.ip_address(host)]
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(sockaddr[0]) for *_, sockaddr in found]


async def _cut(server: asyncio.Server | handoff.Listener | None, connections: set[asyncio.Task[None]]) -> None:
    """Stop accepting (when there is a server), then cancel the connections and wait for them."""
    if server is not None:
        server.close()
    for task in list(connections):
        task.cancel()
    await asyncio.gather(*connections, return_exceptions=True)


def _swapped(head: heads.Head, sandbox: _Sandbox, decision: Decision) -> tuple[heads.Head, Decision]:
    """The head with the sandbox's placeholders for its host swapped in, or a denial when it
    carries one meant for another host."""
    try:
        return placeholders.swap(head, sandbox.placeholders), decision
    except placeholders.Leak as leak:
        return head, Decision(False, reason=f"the placeholder of secret {leak.name} is not for {head.host}")


def _send_head(counters: _Counters, writer: asyncio.StreamWriter, head: heads.Head) -> None:
    forwarded = heads.forwarded_head(head)
    writer.write(forwarded)
    counters.up(len(forwarded))


@dataclass
class _Counters:
    """Counts a connection's bytes into its entry, its sandbox's totals and the metrics."""

    entry: EgressEntry
    sandbox: _Sandbox

    def up(self, size: int) -> None:
        self.entry.bytes_up += size
        self.sandbox.bytes_up += size
        metrics.EGRESS_BYTES.labels(direction="up").inc(size)

    def down(self, size: int) -> None:
        self.entry.bytes_down += size
        self.sandbox.bytes_down += size
        metrics.EGRESS_BYTES.labels(direction="down").inc(size)


async def _requests(
    sandbox: _Sandbox,
    counters: _Counters,
    head: heads.Head,
    parse: Callable[[bytes], heads.Head],
    reader: asyncio.StreamReader,
    upstream: asyncio.StreamWriter,
) -> bytes | None:
    """Forward the requests of an intercepted connection upstream, each swapped, starting with
    `head` (already swapped), while the client keeps the connection. None when the last one
    asked to close (the upstream's answer ends the connection); else the answer to give the
    client once the upstream is cut: b"" when the client ended, a refusal when a request was
    refused (a well-formed answer to a client that waits for each answer before its next
    request, as clients that do not pipeline do)."""
    try:
        while True:
            length = heads.body_length(head)
            keep_alive = heads.persistent(head)
            forwarded = heads.forwarded_head(head, keep_alive=keep_alive)
            upstream.write(forwarded)
            counters.up(len(forwarded))
            await copy_body(reader, upstream, length, sandbox.up, counters.up)
            if not keep_alive:
                return None
            try:
                head = parse(await reader.readuntil(b"\r\n\r\n"))
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise heads.BadRequest(400, "an incomplete request head") from None
                return b""
            head, decision = _swapped(head, sandbox, Decision(True, counters.entry.rule))
            if not decision.allowed:
                reason = decision.describe() + _INTERCEPTED
                sandbox.entries.append(EgressEntry(int(time.time() * 1000), head.host, head.port, False, "", reason))
                metrics.EGRESS_CONNECTIONS.labels(verdict="denied").inc()
                return _response(403, f"egress to {head.host}:{head.port} {decision.describe()}")
    except asyncio.LimitOverrunError:
        return _response(431, "request head too large")
    except heads.BadRequest as exc:
        return _response(exc.status, exc.reason)


async def _splice(
    sandbox: _Sandbox,
    entry: EgressEntry,
    inside: _Stream,
    outside: _Stream,
) -> None:
    """Bytes both ways until both sides are done, counted into `entry`, the sandbox's totals and
    the metrics."""
    counters = _Counters(entry, sandbox)
    try:
        if splicing.available(inside[1], outside[1]):
            await splicing.splice_both(
                inside, outside, up=(sandbox.up, counters.up), down=(sandbox.down, counters.down)
            )
            return
        await asyncio.gather(
            pump(inside[0], outside[1], sandbox.up, counters.up),
            pump(outside[0], inside[1], sandbox.down, counters.down),
        )
    finally:
        outside[1].close()


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: bytes) -> None:
    """Answer, then read what the client is still sending (at most `_LINGER_BYTES`, for at
    most `_LINGER_SECONDS`) before the close: closing on unread data resets the connection,
    and the client would see the reset instead of the answer."""
    writer.write(response)
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(_LINGER_SECONDS):
            drained = 0
            while drained < _LINGER_BYTES and (data := await reader.read(CHUNK)):
                drained += len(data)


def _response(status: int, message: str, extra: str = "") -> bytes:
    body = (message + "\n").encode()
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: text/plain\r\n{extra}"
    return head.encode() + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
