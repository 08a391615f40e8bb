"""Drive the installed `warmshell` command the way a user types it, against a real gateway
process (`warmshell gateway start`) with its own state directory."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.helpers.prelude import after_prelude

__all__ = ["CliGateway", "configured_gateway", "start_gateway", "warmshell_env", "warmshell_executable"]

START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 30.0
COMMAND_TIMEOUT_SECONDS = 60.0


def warmshell_executable() -> str:
    """The console script installed with the package (fails loudly if it is not installed)."""
    path = shutil.which("warmshell")
    assert path is not None, "the `warmshell` console script is not on PATH: pip install -e ."
    return path


def warmshell_env(state_dir: Path) -> dict[str, str]:
    """This process's environment minus any WARMSHELL_* settings, pointed at `state_dir`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSHELL_")}
    env["WARMSHELL_STATE_DIR"] = str(state_dir)
    return env


@dataclass
class CliGateway:
    """A running `warmshell gateway start` process and a way to run CLI commands against it."""

    process: subprocess.Popen[bytes]
    state_dir: Path
    log_path: Path
    info: dict[str, Any]

    def log(self) -> str:
        """Everything the gateway printed so far (for failure messages)."""
        return self.log_path.read_text(errors="replace")

    def run(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        """`warmshell ARGS...` with this gateway's state directory; output captured as text."""
        return subprocess.run(
            [warmshell_executable(), *args],
            env=warmshell_env(self.state_dir),
            input=stdin.decode() if stdin is not None else None,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
            check=False,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """`warmshell ARGS...` started in the background, stdout piped (line buffered text)."""
        # A shell runs background jobs with SIGINT ignored, and Python then never raises
        # KeyboardInterrupt; restore the default so tests can press "Ctrl-C".
        return subprocess.Popen(
            after_prelude(
                "import signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)", [warmshell_executable(), *args]
            ),
            env=warmshell_env(self.state_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def stop(self) -> int:
        """SIGTERM, then wait for the graceful shutdown; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"gateway ignored SIGTERM for {STOP_TIMEOUT_SECONDS}s:\n{self.log()}") from None


def _announced_by(info_path: Path, pid: int) -> bool:
    try:
        return bool(json.loads(info_path.read_text()).get("pid") == pid)
    except (FileNotFoundError, ValueError):
        return False


def _wait_for_runtime_info(process: subprocess.Popen[bytes], info_path: Path, log: IO[bytes]) -> None:
    # The gateway announces it is listening by writing gateway.json (atomically, by rename).
    # The stdlib has no inotify, so wait on the process itself in short slices — returning at
    # once if it dies — and look for the file between slices. A gateway killed on the same
    # state dir leaves its own file behind, so only a file naming this process counts.
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not _announced_by(info_path, process.pid):
        try:
            process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise AssertionError(f"gateway did not write {info_path} in {START_TIMEOUT_SECONDS}s") from None
            continue
        log.flush()
        raise AssertionError(f"gateway exited with {process.returncode} before listening")


def launch_gateway(state_dir: Path, *extra_args: str, log_path: Path, http_port: int = 0) -> subprocess.Popen[bytes]:
    """`warmshell gateway start --state-dir STATE --http-port PORT EXTRA...`, output to
    `log_path`, not waited for."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [
                warmshell_executable(),
                "gateway",
                "start",
                "--state-dir",
                str(state_dir),
                "--http-port",
                str(http_port),
                *extra_args,
            ],
            env=warmshell_env(state_dir),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def start_gateway(state_dir: Path, *extra_args: str) -> CliGateway:
    """`warmshell gateway start --state-dir STATE --http-port 0 EXTRA...`, once it is listening."""
    log_path = state_dir.parent / f"{state_dir.name}-gateway.log"
    process = launch_gateway(state_dir, *extra_args, log_path=log_path)
    with log_path.open("ab") as log:
        try:
            _wait_for_runtime_info(process, state_dir / "gateway.json", log)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- gateway log ---\n{log_path.read_text(errors='replace')}") from None
    info = json.loads((state_dir / "gateway.json").read_text())
    return CliGateway(process=process, state_dir=state_dir, log_path=log_path, info=info)


@contextlib.contextmanager
def configured_gateway(root: Path, config: str, *extra_args: str) -> Iterator[CliGateway]:
    """A gateway with `config` as its config file (written under `root`, its state there too),
    that must stop cleanly (SIGTERM, exit 0) when the block ends."""
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    path = root / "gateway.toml"
    path.write_text(config)
    running = start_gateway(root / "state", "--config", str(path), *extra_args)
    try:
        yield running
    finally:
        assert running.stop() == 0, running.log()
