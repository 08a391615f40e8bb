"""Start-up failures a user can cause, as one line each: what is wrong and what to do about it.

`gateway start` runs `preflight` before it opens anything (so a refused start leaves no half-made
state and logs nothing), and `explain` for whatever still fails while the gateway starts. Both are
about the user's machine (ports, paths), not about requests, so they live with the command.
"""

from __future__ import annotations

import errno
import socket

from warmshell.core import config

__all__ = ["MAX_UNIX_SOCKET_PATH_BYTES", "StartupError", "explain", "preflight"]

# sun_path is 108 bytes on Linux, one of them the terminating NUL.
MAX_UNIX_SOCKET_PATH_BYTES = 107

_PORT_FIX = "pass --http-port N, or --http-port 0 for any free port"


class StartupError(Exception):
    """A start-up failure with its one-line explanation (cause, then the fix)."""


def preflight(gateway: config.GatewayConfig) -> None:
    """Refuse, before anything is opened, a start that cannot work: a state directory too long
    for its sockets, or an HTTP port already taken."""
    paths = gateway.paths
    for path in (paths.socket, paths.supervisor_socket):
        size = len(bytes(path))
        if size > MAX_UNIX_SOCKET_PATH_BYTES:
            raise StartupError(
                f"the socket path {path} is {size} bytes, more than the {MAX_UNIX_SOCKET_PATH_BYTES} "
                "a Unix socket allows: choose a shorter --state-dir"
            )
    if gateway.http_port:
        _check_port_free(gateway.http_host, gateway.http_port)


def _check_port_free(host: str, port: int) -> None:
    # Bind the way the HTTP server will (SO_REUSEADDR, so a port in TIME_WAIT is not "busy"),
    # then let go: the common mistake, a second gateway on the default port, fails here cleanly.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as exc:
        raise StartupError(_port_message(host, port, exc)) from exc
    finally:
        probe.close()


def _port_message(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"HTTP port {host}:{port} is already in use (another gateway?): {_PORT_FIX}"
    if exc.errno == errno.EACCES:
        return f"HTTP port {host}:{port} needs privileges this user lacks: {_PORT_FIX}"
    return f"cannot listen on HTTP {host}:{port}: {exc.strerror}: {_PORT_FIX}"


def explain(exc: BaseException, gateway: config.GatewayConfig) -> str | None:
    """The one line for a start-up failure this module knows, else None (an unexpected error)."""
    if isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
        # The only TCP listener bound with Python sockets is the HTTP one (gRPC binds its own).
        return _port_message(gateway.http_host, gateway.http_port, exc)
    if isinstance(exc, RuntimeError) and str(exc).startswith("Failed to bind to address"):
        if gateway.listen_tcp and gateway.listen_tcp in str(exc):
            return (
                f"cannot listen on {gateway.listen_tcp} (in use, or not an address of this host): "
                "choose another --listen-tcp HOST:PORT"
            )
        return f"cannot create the gateway's sockets under {gateway.state_dir}: choose another --state-dir"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or gateway.state_dir}: permission denied: choose a --state-dir this user can write"
    return None
