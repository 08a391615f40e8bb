"""Where the gateway is and which token to present, decided the same way for the SDK and the CLI:
an explicit value, else the `WARMSHELL_*` environment, else the state directory's socket and
token file. Free of grpc and pydantic, so the CLI can use it without paying for either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from warmshell.core import paths
from warmshell.sdk import errors

__all__ = ["Target", "read_token_file", "resolve", "target_address", "unix_socket_path"]

ENV_GATEWAY = "WARMSHELL_GATEWAY"
ENV_TOKEN = "WARMSHELL_API_TOKEN"
ENV_WORKSPACE = "WARMSHELL_WORKSPACE"


class Target(NamedTuple):
    """A gRPC target, the bearer token for it (None: present none), and the default workspace.
    (A NamedTuple: the dataclasses module costs the CLI's every call milliseconds to import.)"""

    address: str
    token: str | None
    workspace: str = ""


def target_address(gateway: str | None, state_dir: Path) -> str:
    """A gRPC target: `gateway` (unix:///path, a bare /path, or host:port), else the socket in
    `state_dir`."""
    if gateway:
        return f"unix://{gateway}" if gateway.startswith("/") else gateway
    return f"unix://{paths.StatePaths(state_dir).socket}"


def read_token_file(path: Path) -> str | None:
    """The token stored at `path`, or None when there is no such file; one that cannot be read
    raises Unauthenticated naming the file and why."""
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise errors.Unauthenticated(
            f"cannot read the API token at {path}: {exc.strerror or exc}", code="UNAUTHENTICATED"
        ) from None


def unix_socket_path(address: str) -> Path | None:
    """The socket path of a `unix:` target (`unix:///abs` or `unix:rel`), else None."""
    if address.startswith("unix://"):
        return Path(address.removeprefix("unix://"))
    if address.startswith("unix:"):
        return Path(address.removeprefix("unix:"))
    return None


def resolve(
    *,
    address: str | None = None,
    token: str | None = None,
    state_dir: Path | str | None = None,
    workspace: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Target:
    """Fill what the caller left out from the environment and the state directory."""
    env = os.environ if environ is None else environ
    root = Path(state_dir) if state_dir is not None else paths.default_state_dir()
    resolved = target_address(address or env.get(ENV_GATEWAY), root)
    bearer = token or env.get(ENV_TOKEN) or read_token_file(paths.StatePaths(root).api_token)
    return Target(address=resolved, token=bearer, workspace=workspace or env.get(ENV_WORKSPACE, ""))
