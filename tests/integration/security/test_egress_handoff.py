"""The egress proxy's hand-off socket under attack: the workload can connect to the Unix socket
its agent hands connections (and its listener) over, and send any descriptor. Nothing it sends
is served: its channel is refused (its peer is not the sandbox's agent), and a descriptor that is
not a connected TCP socket (for a connection) or a listening TCP socket on loopback outside the
gateway's network namespace (for the listener) is refused even from an admitted peer; each
refusal is counted, and the gateway keeps no descriptor of any of it.

The first test attacks from inside a real bwrap'd sandbox; the others hand descriptors to a
proxy in this process, through a real Unix socket, with the peer check opened to this process
so that each descriptor meets the checks behind it."""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import os
import resource
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.upstreams import Upstream, upstream
from tests.integration.security.support import py, sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.config import NetworkConfig
from warmshell.core.egress import Policy, parse_rules
from warmshell.gateway import metrics
from warmshell.gateway.egress import handoff
from warmshell.gateway.egress.proxy import EgressProxy

pytestmark = pytest.mark.timeout(90)

_RESULTS = (
    "accepted",
    "listener",
    "refused_channel",
    "not_socket",
    "not_tcp",
    "not_connected",
    "not_listening",
    "not_loopback",
    "own_netns",
    "unknown_netns",
    "many_listeners",
    "many_fds",
    "no_fd",
    "bad_record",
)


def _counts() -> dict[str, float]:
    return {result: metrics.EGRESS_HANDOFFS.labels(result=result)._value.get() for result in _RESULTS}


def _added(before: dict[str, float]) -> dict[str, float]:
    return {result: count - before[result] for result, count in _counts().items() if count != before[result]}


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _settled(fds: int) -> int:
    """This process's descriptor count once it is back to `fds` (or after 5 s, what it is)."""
    for _ in range(100):
        if _open_fds() == fds:
            break
        await asyncio.sleep(0.05)
    return _open_fds()


# Each attack on its own channel: the descriptor sent, and what it is.
_INSIDE = """
import array, os, socket, sys
path = "/run/warmshell/egress/proxy.sock"
def hand(fds, record=b"C"):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as channel:
        channel.connect(path)
        try:
            channel.sendmsg([record], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            channel.recv(1)
        except OSError:
            pass
listener = socket.create_server(("127.0.0.1", 0))
mine = socket.create_connection(listener.getsockname())
served, _ = listener.accept()
read, write = os.pipe()
pair = socket.socketpair()
looped = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
looped.connect(path)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
with open("/etc/passwd") as handle:
    for fds in ([served.fileno()], [read], [pair[0].fileno()], [listener.fileno()], [udp.fileno()],
                [handle.fileno()], [looped.fileno()], [served.fileno()] * 200):
        hand(fds)
    hand([listener.fileno()], b"L")  # its own listener, as the agent hands its own over
print("sent")
"""


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state", **{"network.requests_may_widen": True}) as running:
        yield running


@pytest.fixture
async def allowed() -> AsyncIterator[Upstream]:
    async with upstream("127.0.0.2") as server:
        yield server


async def test_the_workload_cannot_hand_the_proxy_anything(gw: RunningGateway, allowed: Upstream) -> None:
    spec = pb.SandboxSpec(network=pb.NetworkPolicy(allow=[allowed.authority]))
    await sandbox(gw, "handy", spec)
    first = _counts()
    assert (await sh(gw, "handy", f"curl -sS http://{allowed.authority}/first"))[1] == "upstream saw /first\n"
    # The agent handed its first connection, then its listener.
    assert _added(first) == {"accepted": 1, "listener": 1}
    fds, before = _open_fds(), _counts()
    code, out, err = await py(gw, "handy", _INSIDE)
    assert (code, out) == (0, "sent\n"), err
    # The workload's 10 channels (its own connection, a pipe, a Unix socket, a listening
    # socket, a UDP socket, a file, a channel of its own, 200 descriptors, its listener as a
    # listener, and the one it kept open) each refused at the door, counted, and nothing of
    # them kept.
    for _ in range(100):
        if _added(before).get("refused_channel", 0) >= 10:
            break
        await asyncio.sleep(0.05)
    assert _added(before) == {"refused_channel": 10}
    assert await _settled(fds) == fds
    # The agent's listener still serves (the proxy accepts on it: no hand-off counted), and
    # only its connections reached the upstream.
    assert (await sh(gw, "handy", f"curl -sS http://{allowed.authority}/after"))[1] == "upstream saw /after\n"
    assert _added(before) == {"refused_channel": 10}
    assert [head.split(b" ")[1] for head in allowed.heads] == [b"/first", b"/after"]


@asynccontextmanager
async def _proxy(directory: Path, allowed: Upstream, config: NetworkConfig) -> AsyncIterator[tuple[EgressProxy, Path]]:
    """A proxy for one sandbox allowed `allowed`, at a socket in `directory`, every peer admitted."""
    proxy = EgressProxy(config, peer=lambda channel: True)
    path = directory / "proxy.sock"
    policy = Policy(allow=(parse_rules([allowed.authority], field="allow"),))
    await proxy.open("sandbox-1", path, policy)
    try:
        yield proxy, path
    finally:
        await proxy.aclose()


@pytest.fixture
async def opened(tmp_path: Path, allowed: Upstream) -> AsyncIterator[tuple[EgressProxy, Path]]:
    """Two connections at most."""
    async with _proxy(tmp_path, allowed, NetworkConfig(max_connections=2)) as made:
        yield made


@contextmanager
def _connected_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A TCP connection on loopback: (the client's end, the end a listener accepted)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        served, _ = listener.accept()
    with client, served:
        yield client, served


def _hand(path: Path, fds: list[int], record: bytes = b"C") -> socket.socket:
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel.connect(str(path))
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    channel.sendmsg([record], ancillary)
    return channel


async def _counted(before: dict[str, float], result: str) -> dict[str, float]:
    for _ in range(100):
        if result in _added(before):
            break
        await asyncio.sleep(0.02)
    return _added(before)


async def test_each_descriptor_but_a_connected_tcp_socket_is_refused_and_closed(
    opened: tuple[EgressProxy, Path],
) -> None:
    _, path = opened
    fds = _open_fds()
    with ExitStack() as held:
        listening = held.enter_context(socket.create_server(("127.0.0.1", 0)))
        file = held.enter_context(open(os.devnull, "rb"))
        tcp = held.enter_context(_connected_pair())
        read, write = os.pipe()
        located = os.open(path, os.O_PATH)  # the socket file's mode, but no socket
        for fd in (read, write, located):
            held.callback(os.close, fd)
        unix = socket.socketpair()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        looped = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for made in (*unix, udp, looped):
            held.enter_context(made)
        looped.connect(str(path))  # a socket connected to the proxy's own hand-off socket
        attacks = [
            ([read], b"C", "not_socket"),
            ([file.fileno()], b"C", "not_socket"),
            ([located], b"C", "not_socket"),
            ([unix[0].fileno()], b"C", "not_tcp"),
            ([udp.fileno()], b"C", "not_tcp"),
            ([looped.fileno()], b"C", "not_tcp"),
            ([listening.fileno()], b"C", "not_connected"),
            ([tcp[1].fileno()] * 200, b"C", "many_fds"),
            ([tcp[1].fileno()] * 2, b"C", "many_fds"),
            ([], b"C", "no_fd"),
            ([tcp[1].fileno()], b"GET / HTTP/1.1\r\n\r\n", "bad_record"),
        ]
        for descriptors, record, reason in attacks:
            before = _counts()
            with _hand(path, descriptors, record):
                assert await _counted(before, reason) == {reason: 1}, reason
    # Every descriptor the proxy received is closed, and every channel (the looped one too).
    assert await _settled(fds) == fds


async def test_a_handed_connection_is_served_and_bounded(opened: tuple[EgressProxy, Path], allowed: Upstream) -> None:
    proxy, path = opened
    fds = _open_fds()
    with _connected_pair() as first, _connected_pair() as second, _connected_pair() as third:
        channel = _hand(path, [first[1].fileno()])
        # Served through its own socket: the proxy has its own descriptor, this one may go.
        first[1].close()
        first[0].sendall(f"CONNECT {allowed.authority} HTTP/1.1\r\n\r\n".encode())
        assert (await asyncio.to_thread(first[0].recv, 100)).startswith(b"HTTP/1.1 200")
        await asyncio.to_thread(first[0].sendall, f"GET /tunnel HTTP/1.1\r\nHost: {allowed.authority}\r\n\r\n".encode())
        assert b"upstream saw /tunnel" in await asyncio.to_thread(first[0].recv, 1000)
        # max_connections = 2: the third open one is answered 429 and closed.
        channel.sendmsg([b"C"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [second[1].fileno()]))])
        channel.sendmsg([b"C"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [third[1].fileno()]))])
        third[0].settimeout(5)
        assert (await asyncio.to_thread(third[0].recv, 100)).startswith(b"HTTP/1.1 429")
        assert proxy.traffic("sandbox-1") is not None
        channel.close()
    await proxy.close("sandbox-1")
    assert await _settled(fds) == fds


async def test_only_the_sandboxs_agent_may_hand_connections_over(tmp_path: Path) -> None:
    # This process is pid 1 of no namespace below the gateway's: its channel is refused.
    path = tmp_path / "proxy.sock"
    listener = handoff.Listener(path, lambda made: made.close(), channels=4)
    try:
        before = _counts()
        with _connected_pair() as tcp, _hand(path, [tcp[1].fileno()]):
            assert await _counted(before, "refused_channel") == {"refused_channel": 1}
    finally:
        listener.close()


async def test_the_agent_hands_over_again_once_its_proxy_socket_is_replaced(
    gw: RunningGateway, allowed: Upstream
) -> None:
    spec = pb.SandboxSpec(network=pb.NetworkPolicy(allow=[allowed.authority]))
    ready = await sandbox(gw, "again", spec)
    assert (await sh(gw, "again", f"curl -sS http://{allowed.authority}/one"))[1] == "upstream saw /one\n"
    # Opened anew (as an activation does): the agent's channel to the old socket is closed, and
    # its next connection goes over a new one.
    proxy = gw.gateway.parts.egress.proxy
    path, policy = proxy.socket_path(ready.id), proxy.policy(ready.id)
    assert path is not None
    assert policy is not None
    await proxy.open(ready.id, path, policy)
    before = _counts()
    assert (await sh(gw, "again", f"curl -sS http://{allowed.authority}/two"))[1] == "upstream saw /two\n"
    # The agent took its listener back when the old channel closed, and hands it over again.
    assert _added(before) == {"accepted": 1, "listener": 1}
    assert (await sh(gw, "again", f"curl -sS http://{allowed.authority}/three"))[1] == "upstream saw /three\n"
    assert _added(before) == {"accepted": 1, "listener": 1}


async def test_a_handed_connection_keeps_the_sandboxs_byte_rate_and_counts(tmp_path: Path, allowed: Upstream) -> None:
    # 512 KiB/s up, after a second's worth of burst; the splices take up to a pipe's worth
    # (1 MiB) per step before they wait: 3 MiB take 3 s or more.
    rate, size, step = 512 * 1024, 3 << 20, 1 << 20
    bytes_up = metrics.EGRESS_BYTES.labels(direction="up")._value.get()
    allowed_before = metrics.EGRESS_CONNECTIONS.labels(verdict="allowed")._value.get()
    async with _proxy(tmp_path, allowed, NetworkConfig(max_bytes_per_second=rate)) as (proxy, path):
        with _connected_pair() as (client, served), _hand(path, [served.fileno()]):
            client.settimeout(20)
            head = f"POST http://{allowed.authority}/up HTTP/1.1\r\nContent-Length: {size}\r\n\r\n"
            start = time.monotonic()
            await asyncio.to_thread(client.sendall, head.encode() + bytes(size))
            answer = await asyncio.to_thread(client.recv, 1000)
            elapsed = time.monotonic() - start
        up, _ = proxy.traffic("sandbox-1") or (0, 0)
    assert b"upstream saw /up" in answer
    assert allowed.bodies[-1] == bytes(size)
    assert elapsed >= (size - rate - step) / rate * 0.9, elapsed
    assert up > size
    assert metrics.EGRESS_BYTES.labels(direction="up")._value.get() - bytes_up == up
    assert metrics.EGRESS_CONNECTIONS.labels(verdict="allowed")._value.get() - allowed_before == 1


class _CountingListener(handoff.Listener):
    """Counts the readiness events of its listening socket."""

    events = 0

    def _connected(self) -> None:
        type(self).events += 1
        super()._connected()


_CONNECT_ON_A_LINE = """
import socket, sys
sys.stdin.readline()
channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
channel.connect(sys.argv[1])
print("connected", flush=True)
sys.stdin.readline()
"""


async def test_a_gateway_out_of_descriptors_pauses_its_accepts_and_takes_the_channel_later(tmp_path: Path) -> None:
    path = tmp_path / "proxy.sock"
    listener = _CountingListener(path, lambda made: made.close(), channels=4)
    before = _counts()
    peer = await asyncio.create_subprocess_exec(
        "python3", "-c", _CONNECT_ON_A_LINE, str(path), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert peer.stdin is not None
    assert peer.stdout is not None
    try:
        with _descriptors_exhausted():
            _CountingListener.events = 0
            peer.stdin.write(b"go\n")
            assert await peer.stdout.readline() == b"connected\n"
            await asyncio.sleep(0.3)
            # Paused: a readable listener it cannot accept from is not polled in a loop.
            assert 1 <= _CountingListener.events <= 5, _CountingListener.events
            assert _added(before) == {}
        # Resumed: the channel is accepted and judged (this process is not a sandbox's agent).
        assert await _counted(before, "refused_channel") == {"refused_channel": 1}
    finally:
        peer.stdin.write(b"done\n")
        await peer.wait()
        listener.close()


@contextmanager
def _descriptors_exhausted() -> Iterator[None]:
    """Every descriptor number below this process's limit taken, until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        while not fillers or fillers[-1] < highest:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        resource.setrlimit(resource.RLIMIT_NOFILE, (fillers[-1] + 1, hard))
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in fillers:
            os.close(fd)


async def _closed_by_proxy(channel: socket.socket) -> bool:
    """Whether the proxy closed this channel (its end read as end of file within 5 s)."""
    channel.settimeout(5)
    try:
        return await asyncio.to_thread(channel.recv, 1) == b""
    except TimeoutError:
        return False


async def test_each_descriptor_but_a_sandboxs_listener_is_refused_and_its_channel_closed(
    opened: tuple[EgressProxy, Path],
) -> None:
    _, path = opened
    fds = _open_fds()
    with ExitStack() as held:
        # Listening on loopback, but in the gateway's own network namespace: it would take the
        # host's connections to that port as the sandbox's.
        own = held.enter_context(socket.create_server(("127.0.0.1", 0)))
        wildcard = held.enter_context(socket.create_server(("0.0.0.0", 0)))
        tcp = held.enter_context(_connected_pair())
        udp = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        unix = held.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        unix.bind(str(path.parent / "other.sock"))
        unix.listen()
        read, write = os.pipe()
        for fd in (read, write):
            held.callback(os.close, fd)
        attacks = [
            ([own.fileno()], "own_netns"),
            ([wildcard.fileno()], "not_loopback"),
            ([tcp[1].fileno()], "not_listening"),
            ([udp.fileno()], "not_tcp"),
            ([unix.fileno()], "not_tcp"),
            ([read], "not_socket"),
            ([own.fileno()] * 2, "many_fds"),
        ]
        for descriptors, reason in attacks:
            before = _counts()
            with _hand(path, descriptors, b"L") as channel:
                assert await _counted(before, reason) == {reason: 1}, reason
                # Closed (a refused listener is not waited on): the agent takes its own back.
                assert await _closed_by_proxy(channel) == (reason != "many_fds"), reason
    assert await _settled(fds) == fds


# A process in a network namespace of its own (as a sandbox's agent is) handing its listener to
# the proxy at argv[1], driven a line at a time: "L" hands it (again), "C" connects through it
# to the upstream at argv[2] and prints the proxy's status line and the upstream's last, "A"
# connects and prints once the other side closed, "EOF" prints whether the proxy closed the
# channel.
_FOREIGN = """
import array, ctypes, fcntl, socket, struct, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:  # CLONE_NEWNET
    print("no namespace", flush=True)
    sys.exit(0)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # its loopback up: SIOCSIFFLAGS
    fcntl.ioctl(probe, 0x8914, struct.pack("16sH14x", b"lo", 0x41))
listener = socket.create_server(("127.0.0.1", 0))
channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
channel.connect(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    if line == "L\\n":
        channel.sendmsg([b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [listener.fileno()]))])
        print("handed", flush=True)
    elif line == "C\\n":
        with socket.create_connection(listener.getsockname(), timeout=10) as made:
            made.sendall(f"CONNECT {sys.argv[2]} HTTP/1.1\\r\\n\\r\\n".encode())
            status = made.recv(100).split(b"\\r\\n")[0].decode()
            made.sendall(b"GET /through HTTP/1.1\\r\\nHost: upstream\\r\\nConnection: close\\r\\n\\r\\n")
            answer = b""
            while data := made.recv(1000):
                answer += data
            print(status, answer.splitlines()[-1].decode(), sep=": ", flush=True)
    elif line == "A\\n":
        with socket.create_connection(listener.getsockname(), timeout=10) as made:
            print("closed" if made.recv(1) == b"" else "data", flush=True)
    elif line == "EOF\\n":
        channel.settimeout(2)
        try:
            print("closed" if channel.recv(1) == b"" else "data", flush=True)
        except TimeoutError:
            print("open", flush=True)
    else:
        break
"""


def _sockets_of_other_namespaces() -> int:
    """How many of this process's descriptors are sockets of another network namespace."""
    own, count = os.stat("/proc/self/ns/net"), 0
    for name in os.listdir("/proc/self/fd"):
        try:
            namespace = fcntl.ioctl(int(name), 0x894C)  # SIOCGSKNS: not a socket, or gone: OSError
        except OSError:
            continue
        found = os.fstat(namespace)
        os.close(namespace)
        count += (found.st_dev, found.st_ino) != (own.st_dev, own.st_ino)
    return count


async def _of_other_namespaces(count: int) -> bool:
    """Whether this process holds `count` sockets of other network namespaces (within 5 s)."""
    for _ in range(100):
        if _sockets_of_other_namespaces() == count:
            return True
        await asyncio.sleep(0.05)
    return False


@asynccontextmanager
async def _foreign(path: Path, allowed: Upstream) -> AsyncIterator[Callable[[str], Awaitable[str]]]:
    """The process above, as a function of one command to its one line of answer."""
    process = await asyncio.create_subprocess_exec(
        "python3", "-c", _FOREIGN, str(path), allowed.authority, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None
    assert process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def say(command: str) -> str:
        stdin.write(command.encode() + b"\n")
        return (await asyncio.wait_for(stdout.readline(), 10)).decode().strip()

    try:
        started = (await asyncio.wait_for(stdout.readline(), 10)).decode().strip()
        if started == "no namespace":
            pytest.skip("this host lets no process make a network namespace")
        yield say
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def test_a_sandboxs_listener_is_accepted_on_and_given_up_with_its_channel(
    opened: tuple[EgressProxy, Path], allowed: Upstream
) -> None:
    _, path = opened
    fds = _open_fds()
    async with _foreign(path, allowed) as say:
        before = _counts()
        assert await say("L") == "handed"
        assert await _counted(before, "listener") == {"listener": 1}
        # The proxy accepts on it: a connection made there is served, with no hand-off.
        assert await say("C") == "HTTP/1.1 200 Connection established: upstream saw /through"
        assert await say("EOF") == "open"
        # One listener a channel: a second is refused, and the channel closed with the first.
        assert await say("L") == "handed"
        assert await _counted(before, "many_listeners") == {"listener": 1, "many_listeners": 1}
        assert await say("EOF") == "closed"
        assert await _of_other_namespaces(0)  # its listener let go while its agent lives on
    async with _foreign(path, allowed) as say:
        assert await say("L") == "handed"
        assert await _counted(before, "listener") == {"listener": 2, "many_listeners": 1}
        assert await say("C") == "HTTP/1.1 200 Connection established: upstream saw /through"
    # Its agent ended (the channel closed from its side): the proxy keeps nothing of its
    # namespace alive.
    assert await _of_other_namespaces(0)
    assert await _settled(fds) == fds


class _CountingAccepts(handoff.Listener):
    """Counts the readiness events of the listeners handed to it."""

    events = 0

    def _acceptable(self, channel: int) -> None:
        type(self).events += 1
        super()._acceptable(channel)


async def test_a_gateway_out_of_descriptors_pauses_accepting_on_a_listener_and_resumes(
    tmp_path: Path, allowed: Upstream
) -> None:
    path = tmp_path / "proxy.sock"
    listener = _CountingAccepts(path, lambda made: made.close(), channels=4, peer=lambda channel: True)
    try:
        async with _foreign(path, allowed) as say:
            before = _counts()
            assert await say("L") == "handed"
            assert await _counted(before, "listener") == {"listener": 1}
            with _descriptors_exhausted():
                _CountingAccepts.events = 0
                answer = asyncio.create_task(say("A"))
                await asyncio.sleep(0.3)
                # Paused: a readable listener it cannot accept from is not polled in a loop.
                assert 1 <= _CountingAccepts.events <= 5, _CountingAccepts.events
                assert not answer.done()
            # Resumed: the connection is accepted (and, here, closed).
            assert await answer == "closed"
    finally:
        listener.close()
