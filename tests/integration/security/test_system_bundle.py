"""The system CA bundle of a local sandbox on the host's root, attacked from inside. The staged
/etc's bundle is a symlink into the sandbox's egress directory, whose own link leads back to the
host's bundle kept in the stage, until an activation whose TLS is intercepted replaces that link
with a file of the host's CAs and the gateway's (`drivers/local/runtime/etcstage.py`). What must
hold: no sandbox can replace either link or write through them, and the gateway's CA reaches the
trust of the intercepting sandbox alone; every other sandbox reads the host's bundle byte for
byte, and so does the stage on the host."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, own_sandbox_dir, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox, sh, still_real
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core import egress

_HOST = Path(egress.SYSTEM_BUNDLE)
pytestmark = [
    needs_bwrap,
    pytest.mark.timeout(90),
    pytest.mark.skipif(not _HOST.is_file() or _HOST.is_symlink(), reason="the host has no system bundle to link"),
]

_LINK = f"{egress.SANDBOX_DIR}/{egress.SYSTEM_BUNDLE_COPY}"
_FAKE = "-----BEGIN CERTIFICATE-----\nTUFMSUNF\n-----END CERTIFICATE-----\n"


@pytest.fixture
def sandbox_dir() -> Iterator[Path]:
    with own_sandbox_dir("warmshell-bundle-") as directory:  # so that this gateway's stage is found
        yield directory


@pytest.fixture
async def gw(tmp_path: Path, sandbox_dir: Path) -> AsyncIterator[RunningGateway]:
    overrides = {"network.requests_may_widen": True, "local.sandbox_dir": str(sandbox_dir)}
    async with running_gateway(tmp_path / "state", **overrides) as running:
        yield running


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _bundle_sha(gw: RunningGateway, name: str) -> str:
    code, out, err = await sh(gw, name, f"sha256sum < {egress.SYSTEM_BUNDLE}")
    assert code == 0, err
    return out.split()[0]


def _staged_host_bundle(sandbox_dir: Path) -> bytes:
    """The host's bundle as this gateway's stage keeps it (what every link leads back to)."""
    (staged,) = sandbox_dir.glob(f"etc-*/ssl/certs/{Path(egress.HOST_BUNDLE).name}")
    return staged.read_bytes()


def _intercepted() -> pb.SandboxSpec:
    """A policy whose TLS the proxy intercepts: a placeholder secret for an allowed host."""
    spec = pb.SandboxSpec(network=pb.NetworkPolicy(allow=["127.0.0.2:8443"]))
    spec.secrets["API_KEY"] = "real-value-never-inside"
    spec.secret_hosts["API_KEY"].hosts.append("127.0.0.2:8443")
    return spec


_ATTEMPTS = (
    # Replace a link: the egress directory's, the staged /etc's.
    f"ln -sfn /workspace/evil.pem {_LINK}",
    f"mv -f /workspace/evil.pem {_LINK}",
    f"rm -f {_LINK}",
    f"ln -sfn /workspace/evil.pem {egress.SYSTEM_BUNDLE}",
    f"mv -f /workspace/evil.pem {egress.HOST_BUNDLE}",
    f"touch {egress.SANDBOX_DIR}/planted",
    # Write through them, or to the host's bundle they lead to.
    f"cat /workspace/evil.pem >> {egress.SYSTEM_BUNDLE}",
    f"cat /workspace/evil.pem >> {_LINK}",
    f"cat /workspace/evil.pem >> {egress.HOST_BUNDLE}",
    f"python3 -c \"open('{egress.SYSTEM_BUNDLE}', 'r+b').write(b'x')\"",
    f"truncate -s 0 {egress.HOST_BUNDLE}",
)


async def _attack(gw: RunningGateway, name: str) -> list[tuple[str, int, str]]:
    """Every attempt from inside `name`; those that succeeded."""
    assert (await sh(gw, name, f"printf '%s' '{_FAKE}' > /workspace/evil.pem"))[0] == 0
    succeeded = []
    for attempt in _ATTEMPTS:
        code, out, err = await sh(gw, name, attempt)
        if code == 0:
            succeeded.append((attempt, code, out + err))
    return succeeded


async def test_no_sandbox_replaces_its_bundle_links_or_writes_through_them(
    gw: RunningGateway, sandbox_dir: Path
) -> None:
    host = _HOST.read_bytes()
    await sandbox(gw, "plain")
    assert await _bundle_sha(gw, "plain") == _sha256(host)
    assert await _attack(gw, "plain") == []
    # Nothing changed: not its bundle, not the host's as staged, not a sandbox started after.
    assert await _bundle_sha(gw, "plain") == _sha256(host)
    assert _staged_host_bundle(sandbox_dir) == host
    await sandbox(gw, "later")
    assert await _bundle_sha(gw, "later") == _sha256(host)
    await still_real(gw, "plain")


async def test_the_gateways_ca_is_in_the_trust_of_the_intercepting_sandbox_alone(
    gw: RunningGateway, sandbox_dir: Path
) -> None:
    host = _HOST.read_bytes()
    await sandbox(gw, "before")
    await sandbox(gw, "tls", _intercepted())
    await sandbox(gw, "after")
    code, ca, err = await sh(gw, "tls", f"cat {egress.SANDBOX_DIR}/{egress.CA_FILE}")
    assert code == 0, err
    body = ca.splitlines()[1]  # a line of the CA's own base64, in no host certificate
    # The intercepting sandbox reads the host's CAs, then the gateway's, at the system path.
    code, seen, _ = await sh(gw, "tls", f"cat {egress.SYSTEM_BUNDLE}")
    assert code == 0
    assert seen.encode().startswith(host)
    assert body in seen
    # Every other sandbox, started before it or after: the host's bundle as it is, and the CA
    # nowhere it can read (no egress file of the other's, no /proc of it: a pid namespace each).
    for other in ("before", "after"):
        assert await _bundle_sha(gw, other) == _sha256(host)
        search = f"grep -rlF '{body}' /etc /run /proc/[0-9]*/root/run 2>/dev/null | wc -l"
        assert (await sh(gw, other, search))[1].split() == ["0"]
    # Its own bundle file is no more writable than the link it replaced; the host's is intact.
    assert await _attack(gw, "tls") == []
    assert body in (await sh(gw, "tls", f"cat {egress.SYSTEM_BUNDLE}"))[1]
    assert _staged_host_bundle(sandbox_dir) == host
    assert await _bundle_sha(gw, "after") == _sha256(host)
