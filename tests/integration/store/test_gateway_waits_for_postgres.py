"""A real gateway process whose Postgres is not there at start: it serves `/healthz` (503, naming
the store, never the password) and `/livez` (200) while it keeps retrying, becomes Serving by
itself once a Postgres listens on that port, and stops promptly and cleanly on SIGTERM while it
waits."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.churning_gateway import free_port
from tests.helpers.cli import CliGateway, launch_gateway
from tests.helpers.postgres import DevPostgres

WAIT_SECONDS = 60.0
STOP_SECONDS = 5.0  # "promptly": far below the helpers' 30 s SIGTERM budget


def _get(port: int, path: str) -> tuple[int, str] | None:
    """Status and body of GET http://127.0.0.1:PORT/PATH; None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return None


def _attempts(body: str) -> int:
    found = re.search(r"\((\d+) attempts in \d+s so far; still retrying\)", body)
    return int(found.group(1)) if found else 0


@contextmanager
def _gateway(tmp_path: Path, url: str, password_file: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """`warmshell gateway start` on `url` with the default start-up budget (no limit); yields the
    process, its HTTP port and its log. Killed afterwards if a test left it running."""
    http_port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[store]\nurl = "{url}"\npassword_file = "{password_file}"\nconnect_timeout_seconds = 2.0\n')
    log = tmp_path / "gateway.log"
    process = launch_gateway(tmp_path / "state", "--config", str(config), log_path=log, http_port=http_port)
    try:
        yield process, http_port, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _wait_for(
    process: subprocess.Popen[bytes], log: Path, port: int, what: str, holds: Callable[[int, str], bool]
) -> tuple[int, str]:
    """Poll /healthz (as a kubelet does) until `holds(status, body)`; fail if the gateway exits."""
    deadline = time.monotonic() + WAIT_SECONDS
    last: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the gateway exited ({process.returncode}):\n{log.read_text()}"
        last = _get(port, "/healthz")
        if last is not None and holds(*last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {WAIT_SECONDS}s; last /healthz: {last}\n{log.read_text()}")


def test_a_gateway_waits_for_its_postgres_and_serves_once_it_is_there(
    tmp_path: Path, own_postgres: DevPostgres
) -> None:
    # A real Postgres made and stopped first: its port is then one where nothing listens, and
    # `restart()` brings it back on that very port, with the password the gateway was given.
    own_postgres.stop(keep=True)
    password = own_postgres.password
    db_port = own_postgres.url.rsplit(":", 1)[1].split("/")[0]
    with _gateway(tmp_path, own_postgres.url, own_postgres.password_file) as (process, http_port, log):
        status, body = _wait_for(
            process, log, http_port, "NotServing after a few attempts", lambda _s, body: _attempts(body) >= 5
        )
        assert status == 503
        assert body.startswith("unhealthy: not serving: the store (Postgres at 127.0.0.1:"), body
        assert f"127.0.0.1:{db_port}/warmshell" in body
        assert "is unreachable: connection refused" in body
        assert password not in body
        assert _get(http_port, "/livez") == (200, "ok\n")  # alive, only not ready
        assert _get(http_port, "/metrics") is not None
        assert not (tmp_path / "state" / "gateway.json").exists(), "announced as serving before its store"
        assert process.poll() is None

        own_postgres.restart()
        assert _wait_for(process, log, http_port, "Serving once Postgres is up", lambda s, _b: s == 200) == (
            200,
            "ok\n",
        )
        gateway = CliGateway(
            process=process,
            state_dir=tmp_path / "state",
            log_path=log,
            info=json.loads((tmp_path / "state" / "gateway.json").read_text()),
        )
        created = gateway.run("sandbox", "create", "--name", "after", "-o", "json")
        assert created.returncode == 0, created.stderr + gateway.log()
        assert json.loads(created.stdout)["status"]["phase"] == "SANDBOX_PHASE_READY"
        deleted = gateway.run("sandbox", "delete", "after")
        assert deleted.returncode == 0, deleted.stderr
        assert gateway.stop() == 0, gateway.log()
    output = log.read_text()
    assert password not in output
    assert "Traceback" not in output
    assert "store at 127.0.0.1:" in output
    assert "unreachable (attempt 1," in output
    assert "reachable after" in output


def test_sigterm_while_waiting_for_the_store_stops_promptly_and_cleanly(tmp_path: Path) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("Recognisable-Pa55word\n")
    url = f"postgresql://warmshell@127.0.0.1:{free_port()}/warmshell"
    with _gateway(tmp_path, url, password_file) as (process, http_port, log):
        _, body = _wait_for(process, log, http_port, "NotServing", lambda _s, body: _attempts(body) >= 2)
        assert "Recognisable-Pa55word" not in body
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            status = process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM took more than {STOP_SECONDS}s:\n{log.read_text()}") from None
        assert time.monotonic() - sent < STOP_SECONDS
    output = log.read_text()
    assert status == 0, output  # as a graceful stop of a gateway that had started
    assert "Traceback" not in output
    assert "error:" not in output, output
    assert '"level": "error"' not in output, output
    assert "Recognisable-Pa55word" not in output
    state = tmp_path / "state"
    assert not (state / "gateway.sock").exists()
    assert not (state / "gateway.json").exists()
