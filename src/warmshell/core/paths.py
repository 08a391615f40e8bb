"""Where things are under a gateway's state directory, decided once so the gateway, the CLI and
the tests agree. Free of pydantic on purpose: every CLI call resolves these paths, and only the
gateway needs the configuration model (`warmshell.core.config`)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["StatePaths", "default_state_dir"]


def default_state_dir() -> Path:
    """$WARMSHELL_STATE_DIR, else $XDG_STATE_HOME/warmshell, else ~/.local/state/warmshell."""
    explicit = os.environ.get("WARMSHELL_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "warmshell"


class StatePaths:
    """Well-known files under a gateway state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def socket(self) -> Path:
        """The public API socket (0600)."""
        return self.root / "gateway.sock"

    @property
    def transfer_socket(self) -> Path:
        """The byte stream's socket (0600): file transfers admitted by a one-time ticket."""
        return self.root / "files.sock"

    @property
    def supervisor_socket(self) -> Path:
        """The supervisor API's socket (the local driver's host-side supervisors connect to it)."""
        return self.root / "supervisor.sock"

    @property
    def api_token(self) -> Path:
        """The bearer token clients present (0600, created on first start)."""
        return self.root / "api-token"

    @property
    def signing_key(self) -> Path:
        """The Ed25519 key that signs sandbox tokens (0600)."""
        return self.root / "signing-key.pem"

    @property
    def secrets_key(self) -> Path:
        """The AES-256-GCM key sealing sandbox secrets in the store (0600)."""
        return self.root / "secrets.key"

    @property
    def replica_token(self) -> Path:
        """The credential gateway replicas on one store present to each other (0600)."""
        return self.root / "replica-token"

    @property
    def database(self) -> Path:
        """The SQLite store."""
        return self.root / "warmshell.db"

    @property
    def runtime_info(self) -> Path:
        """JSON written by a running gateway: pid, addresses, HTTP port."""
        return self.root / "gateway.json"

    @property
    def sandboxes(self) -> Path:
        """Per-sandbox working directories of the local driver."""
        return self.root / "sandboxes"

    @property
    def instances(self) -> Path:
        """The local driver's instance records (survive gateway restarts)."""
        return self.root / "instances"
