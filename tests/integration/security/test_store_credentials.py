"""The Postgres store's password: never in a log line or an error (however the URL that holds it
is written), and never in the environment of anything the gateway starts, the sandboxes first.

A password given in `$WARMSHELL_STORE_PASSWORD` lives in the gateway's own environment; every
child that inherits it could show it (in its `/proc/<pid>/environ`, to a workload that reaches
it, to a core dump). A password written into the URL unescaped (a generated one with a `/`)
breaks the URL's authority early, and whatever part of it then parses as a host, port or path
must still not be shown.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.postgres import DevPostgres
from tests.integration.security.support import sandbox, sh
from tests.integration.store.conftest import dev_postgres  # noqa: F401
from warmshell.drivers.local.runtime import hostnames
from warmshell.gateway.store import opening

pytestmark = pytest.mark.timeout(180)

MARKER = "rt-marker-9d1c7e"  # an extra secret-looking variable, to tell inheritance from chance


@pytest.mark.parametrize(
    ("password", "piece"),
    [
        ("s3cret/rest-of-it", "s3cret"),  # '/' ends the authority: "s3cret" parses as a port
        ("1234/5678", "1234"),  # ... and a numeric one is a valid port, so the URL "works"
        ("s3cret#rest-of-it", "s3cret"),  # '#' starts a fragment
        ("s3cret?rest-of-it", "s3cret"),  # '?' starts the query
        ("s3cret@rest-of-it", "rest-of-it"),  # '@' twice: the first part is the user's
        ("s3cret%zzrest", "s3cret"),  # not a percent-escape
    ],
)
def test_a_password_that_breaks_the_url_is_never_shown_or_logged(tmp_path: Path, password: str, piece: str) -> None:
    """`warmshell gateway start` at DEBUG, the password written into the URL unescaped, the
    database unreachable: start-up fails, naming the store, and no part of the password shows."""
    state = tmp_path / "state"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'state_dir = "{state}"\nhttp_port = 0\n[store]\n'
        f'url = "postgresql://warmshell:{password}@127.0.0.1:1/warmshell"\n'
        "startup_timeout_seconds = 0.5\nconnect_timeout_seconds = 0.5\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "warmshell", "gateway", "start", "--config", str(config), "--log-level", "debug"],
        capture_output=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("WARMSHELL_")},
    )
    shown = (done.stdout + done.stderr).decode(errors="replace")
    log = (state / "gateway.log").read_text(errors="replace") if (state / "gateway.log").exists() else ""
    assert done.returncode != 0, shown
    assert "store" in shown, shown
    for text in (shown, log):
        assert password not in text
        assert piece not in text, text[-2000:]


@pytest.fixture
async def gw(
    tmp_path: Path,
    dev_postgres: DevPostgres,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[RunningGateway]:
    """A gateway on Postgres whose password comes from the environment, as a container's would."""
    url = await dev_postgres.create_database()
    monkeypatch.setenv(opening.PASSWORD_ENV, dev_postgres.password)
    monkeypatch.setenv("RT_SECRET_LOOKALIKE", MARKER)
    try:
        async with running_gateway(
            tmp_path / "state", **{"store.url": url, "store.startup_timeout_seconds": 10.0}
        ) as running:
            yield running
    finally:
        await dev_postgres.drop_database(url)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


async def test_no_process_the_gateway_starts_inherits_its_secrets(
    gw: RunningGateway,
    dev_postgres: DevPostgres,  # noqa: F811
) -> None:
    password = dev_postgres.password
    await sandbox(gw, "victim")
    # From inside: the workload's environment, and every environment it can read.
    code, out, err = await sh(gw, "victim", "env; cat /proc/[0-9]*/environ 2>/dev/null; echo END")
    assert "END" in out, (code, err)
    assert password not in out
    assert MARKER not in out
    # From the host: every process this gateway started (bwrap, launchers, agents, workloads).
    seen = 0
    for pid in _descendants(os.getpid()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        seen += 1
        assert password.encode() not in environ, (pid, Path(f"/proc/{pid}/cmdline").read_bytes())
        assert MARKER.encode() not in environ, (pid, Path(f"/proc/{pid}/cmdline").read_bytes())
    assert seen >= 2, "no process of the sandbox was found to check"


async def test_the_hostname_fallback_runs_without_the_gateways_environment(
    gw: RunningGateway,
    dev_postgres: DevPostgres,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When setns is refused the gateway runs `nsenter ... hostname`: a child process of its own,
    which must get none of the gateway's environment."""
    await sandbox(gw, "renamed")
    code, inside, _ = await sh(gw, "renamed", "echo $$; readlink /proc/self/ns/uts")
    assert code == 0
    uts = inside.split()[1]
    pid = next(
        p
        for p in _descendants(os.getpid())
        if _readlink(f"/proc/{p}/ns/uts") == uts and _readlink(f"/proc/{p}/ns/uts") != _readlink("/proc/self/ns/uts")
    )
    envs: list[Any] = []
    spawn = asyncio.create_subprocess_exec

    async def spying(*argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
        envs.append(kwargs.get("env"))
        return await spawn(*argv, **kwargs)

    def refused(_self: object, _pid: int, _name: str) -> None:
        raise PermissionError(1, "refused, as it is to an unprivileged gateway")

    monkeypatch.setattr(hostnames.HostnameSetter, "_set_nowait", refused)
    monkeypatch.setattr(hostnames.asyncio, "create_subprocess_exec", spying)
    await hostnames.HostnameSetter().set(pid, "fallback-name")
    assert (await sh(gw, "renamed", "hostname"))[1].strip() == "fallback-name"  # nsenter really ran
    assert len(envs) == 1
    assert envs[0] is not None, "nsenter inherited the gateway's whole environment"
    assert dev_postgres.password not in str(envs[0])
    assert MARKER not in str(envs[0])


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
