"""The system CA bundle of a local sandbox on the host's root, attacked from inside. The staged
/etc's bundle is a symlink into the sandbox's egress directory, whose own link leads back to the
host's bundle kept in the stage, until an activation whose TLS is intercepted replaces that link
with a link to the bundle of the host's CAs and the gateway's, placed once per gateway in the
staged /etc beside the gateway's CA (`egress.SHARED_TRUST_DIR`; `drivers/local/runtime/etcstage.py`).
Every sandbox may read those public files; what must hold: no sandbox can replace any of the
links, another sandbox's included, nor write through them or to the shared files, and the
gateway's CA reaches the trust of the intercepting sandbox alone (its system bundle and its
environment); every other sandbox reads the host's bundle byte for byte, has no trust variable,
and finds the CA in no directory a tool scans for CAs; the stage on the host keeps the host's
bundle as it was. The names its trust variables give (`ca.pem`, `ca-bundle.pem`) are links into
that shared trust made when each sandbox starts, before any activation decides: a sandbox that
never intercepts has them too and must gain nothing by them."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.helpers import testca
from tests.helpers.gateway import RunningGateway, own_sandbox_dir, running_gateway, runtime_dir_of
from tests.helpers.upstreams import upstream
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import py, sandbox, sh, still_real
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core import egress

_HOST = Path(egress.SYSTEM_BUNDLE)
pytestmark = [
    needs_bwrap,
    pytest.mark.timeout(90),
    pytest.mark.skipif(not _HOST.is_file() or _HOST.is_symlink(), reason="the host has no system bundle to link"),
]

_LINK = f"{egress.SANDBOX_DIR}/{egress.SYSTEM_BUNDLE_COPY}"
_SHARED_CA = f"{egress.SHARED_TRUST_DIR}/{egress.CA_FILE}"
_SHARED_BUNDLE = f"{egress.SHARED_TRUST_DIR}/{egress.BUNDLE_FILE}"
_OWN_BUNDLE = f"{egress.SANDBOX_DIR}/{egress.BUNDLE_FILE}"
_TRUST_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS")
# Whether Python's default context (OpenSSL's default file, or SSL_CERT_FILE) trusts the gateway's CA.
_TRUSTS_CA = (
    "import ssl; ctx = ssl.create_default_context(); "
    "print(any('warmshell' in str(ca['subject']) for ca in ctx.get_ca_certs()))"
)
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
    # The gateway's CA and its bundle, shared by every sandbox, and the links to them.
    f"cat /workspace/evil.pem >> {_SHARED_BUNDLE}",
    f"cat /workspace/evil.pem > {_SHARED_CA}",
    f"ln -sfn /workspace/evil.pem {_SHARED_BUNDLE}",
    f"touch {egress.SHARED_TRUST_DIR}/planted",
    f"cat /workspace/evil.pem >> {_OWN_BUNDLE}",
    f"ln -sfn /workspace/evil.pem {_OWN_BUNDLE}",
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


async def _trusts_ca(gw: RunningGateway, name: str) -> bool:
    code, out, err = await py(gw, name, _TRUSTS_CA)
    assert code == 0, err
    return out.strip() == "True"


async def test_the_gateways_ca_is_in_the_trust_of_the_intercepting_sandbox_alone(
    gw: RunningGateway, sandbox_dir: Path
) -> None:
    host = _HOST.read_bytes()
    await sandbox(gw, "before")
    await sandbox(gw, "tls", _intercepted())
    await sandbox(gw, "proxied", pb.SandboxSpec(network=pb.NetworkPolicy(allow=["127.0.0.2:8443"])))
    await sandbox(gw, "after")
    code, ca, err = await sh(gw, "tls", f"cat {egress.SANDBOX_DIR}/{egress.CA_FILE}")
    assert code == 0, err
    body = ca.splitlines()[1]  # a line of the CA's own base64, in no host certificate
    # The intercepting sandbox reads the host's CAs, then the gateway's, at the system path and
    # where its trust variables point; Python's default context trusts the CA.
    code, seen, _ = await sh(gw, "tls", f"cat {egress.SYSTEM_BUNDLE}")
    assert code == 0
    assert seen.encode().startswith(host)
    assert body in seen
    for variable in _TRUST_VARIABLES:
        code, named, err = await sh(gw, "tls", f'cat "${variable}"')
        assert code == 0, (variable, err)
        assert body in named, variable
    assert await _trusts_ca(gw, "tls")
    # Every other sandbox, started before it or after, with a policy or none: the host's bundle
    # as it is, no trust variable, and the CA in no file where tools look for CAs (Go trusts
    # every file of /etc/ssl/certs; OpenSSL looks names up there), nor in /run (no egress file of
    # the other's, no /proc of it: a pid namespace each).
    for other in ("before", "proxied", "after"):
        assert await _bundle_sha(gw, other) == _sha256(host)
        assert (await sh(gw, other, "env"))[1].count("_CA") == 0
        search = f"grep -rlF '{body}' /etc/ssl/certs /run /proc/[0-9]*/root/run 2>/dev/null | wc -l"
        assert (await sh(gw, other, search))[1].split() == ["0"]
        assert not await _trusts_ca(gw, other)
    # Its own links are no more writable than the link they replaced; the shared files and the
    # host's bundle are intact.
    assert await _attack(gw, "tls") == []
    assert body in (await sh(gw, "tls", f"cat {egress.SYSTEM_BUNDLE}"))[1]
    assert _staged_host_bundle(sandbox_dir) == host
    assert await _bundle_sha(gw, "after") == _sha256(host)


async def test_an_intercepting_activation_links_the_shared_trust_and_no_sandbox_relinks_another(
    gw: RunningGateway, sandbox_dir: Path
) -> None:
    await sandbox(gw, "tls", _intercepted())
    await sandbox(gw, "plain")
    # On the host: the intercepting sandbox's egress names are links into the shared trust
    # (placed once per gateway), not copies of the CA and its ~220 KB bundle; its system bundle
    # link alone was changed by its activation (every sandbox has the other two from its start).
    dirs = list(runtime_dir_of(sandbox_dir).glob("*.egress"))
    (egress_dir,) = [d for d in dirs if str((d / egress.SYSTEM_BUNDLE_COPY).readlink()) == _SHARED_BUNDLE]
    links = {name: str((egress_dir / name).readlink()) for name in (egress.CA_FILE, egress.BUNDLE_FILE)}
    assert links == {egress.CA_FILE: _SHARED_CA, egress.BUNDLE_FILE: _SHARED_BUNDLE}
    assert str((egress_dir / egress.SYSTEM_BUNDLE_COPY).readlink()) == _SHARED_BUNDLE
    # From the other sandbox: the host path of those links, and the shared files.
    assert (await sh(gw, "plain", f"printf '%s' '{_FAKE}' > /workspace/evil.pem"))[0] == 0
    for name in (egress.CA_FILE, egress.BUNDLE_FILE, egress.SYSTEM_BUNDLE_COPY):
        for attempt in (
            f"ln -sfn /workspace/evil.pem {egress_dir / name}",
            f"cat /workspace/evil.pem >> {egress_dir / name}",
        ):
            assert (await sh(gw, "plain", attempt))[0] != 0, attempt
    assert str((egress_dir / egress.SYSTEM_BUNDLE_COPY).readlink()) == _SHARED_BUNDLE
    assert _FAKE.splitlines()[1] not in (await sh(gw, "tls", f"cat {egress.SYSTEM_BUNDLE}"))[1]
    assert await _trusts_ca(gw, "tls")
    await still_real(gw, "tls")


async def test_the_trust_names_linked_at_a_start_buy_a_sandbox_that_does_not_intercept_nothing(
    tmp_path: Path, sandbox_dir: Path
) -> None:
    # Made before any activation decides, they lead to the public shared files, and nothing
    # trusts them unasked: no variable, no system bundle. A workload that points its own trust at
    # them gains nothing either: its proxy intercepts none of its connections (it has no
    # placeholder), so an HTTPS host through it shows its own certificate, never one of the
    # gateway's CA, and the tunnel is left untouched.
    tls, ca_file = testca.server_context(tmp_path, "127.0.0.2")
    overrides = {
        "network.requests_may_widen": True,
        "network.upstream_ca_file": str(ca_file),
        "local.sandbox_dir": str(sandbox_dir),
    }
    async with upstream("127.0.0.2", tls) as api, running_gateway(tmp_path / "state", **overrides) as gw:
        await sandbox(gw, "proxied", pb.SandboxSpec(network=pb.NetworkPolicy(allow=[api.authority])))
        links = f"readlink {egress.SANDBOX_DIR}/{egress.CA_FILE} {_OWN_BUNDLE} {_LINK}"
        assert await sh(gw, "proxied", links) == (0, f"{_SHARED_CA}\n{_SHARED_BUNDLE}\n{egress.HOST_BUNDLE}\n", "")
        assert (await sh(gw, "proxied", "env"))[1].count("_CA") == 0
        assert await _bundle_sha(gw, "proxied") == _sha256(_HOST.read_bytes())
        assert not await _trusts_ca(gw, "proxied")
        # Trusting the gateway's CA by its own choice: the host's certificate is still its own.
        code, _, err = await sh(gw, "proxied", f"curl -sS --cacert {_OWN_BUNDLE} https://{api.authority}/ca")
        assert code != 0
        assert "certificate" in err
        assert await sh(gw, "proxied", f"curl -sSk https://{api.authority}/k") == (0, "upstream saw /k\n", "")
        decisions = (await gw.stub.ListEgress(pb.SandboxRef(name="proxied"), metadata=gw.metadata)).decisions
        assert decisions
        assert not any("TLS intercepted" in d.reason for d in decisions)
        # Nor can it replace them, or write through them to the shared files.
        assert await _attack(gw, "proxied") == []
