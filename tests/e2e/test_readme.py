"""README.md pasted top to bottom: every `sh` block runs, in order, in one bash shell, each
within its time limit, and nothing it started is left running. The blocks are read from
README.md itself, so the test fails when the README drifts from what the code does; the
convention (which blocks run, time limits, skips) is written at the top of README.md."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import start_gateway, warmshell_env
from tests.helpers.readme import Block, readme_blocks
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli import render

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = "readme-block-done"


def test_the_block_reader_follows_the_convention() -> None:
    text = "\n".join(
        [
            "<!--",
            "```sh",
            "inside a comment: not a block",
            "```",
            "-->",
            "```sh",
            "echo one",
            "```",
            "<!-- readme-test: timeout=7 -->",
            "```sh",
            "echo two",
            "```",
            "<!-- readme-test: skip: needs a cluster -->",
            "```sh",
            "echo three",
            "```",
            "```console",
            "$ echo four",
            "```",
        ]
    )
    blocks = readme_blocks(text)
    assert [(b.line, b.language, b.code, b.timeout, b.skip, b.runs) for b in blocks] == [
        (6, "sh", "echo one\n", 120.0, None, True),
        (10, "sh", "echo two\n", 7.0, None, True),
        (14, "sh", "echo three\n", 120.0, "needs a cluster", False),
        (17, "console", "$ echo four\n", 120.0, None, False),
    ]
    with pytest.raises(ValueError, match="skip needs a reason"):
        readme_blocks("<!-- readme-test: skip: -->\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        readme_blocks("```sh\ntrue\n")


def test_the_readme_has_runnable_blocks_and_says_why_it_skips_others() -> None:
    blocks = readme_blocks(README.read_text())
    runnable = [b for b in blocks if b.runs]
    assert len(runnable) >= 3
    assert all(b.skip for b in blocks if b.language == "sh" and not b.runs)


def _shape(value: object) -> object:
    """Keys and scalar types of a JSON document; a list by its first element."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _same_shape(documented: object, actual: object, where: str = "$") -> None:
    if isinstance(documented, dict):
        assert isinstance(actual, dict), where
        assert sorted(documented) == sorted(actual), f"{where}: README has {sorted(documented)}, CLI {sorted(actual)}"
        for key, item in documented.items():
            _same_shape(item, actual[key], f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(actual, list), where
        if documented and actual:
            _same_shape(documented[0], actual[0], f"{where}[0]")
    else:
        assert documented == actual, f"{where}: README shows a {documented}, the CLI prints a {actual}"


def test_the_documented_json_shapes_are_what_the_cli_prints() -> None:
    documents = [json.loads(b.code) for b in readme_blocks(README.read_text()) if b.language == "json"]
    by_first_key = {next(iter(d)): d for d in documents}
    sandbox = pb.Sandbox(name="dev", created_at_ms=1, resource_version=5)
    sandbox.status.conditions.append(pb.Condition(type="Ready", last_transition_time_ms=1))
    sandbox.status.timeline.requested_us = 1
    # GetSandbox's usage of a running sandbox on a host with cgroups: every figure but a writable root.
    sandbox.status.usage.CopyFrom(
        pb.SandboxUsage(cpu_seconds=0.1, memory_bytes=1, memory_peak_bytes=1, processes=2, workspace_bytes=0)
    )
    _same_shape(_shape(by_first_key["created_at_ms"]), _shape(render.to_dict(sandbox)))
    pools = pb.ListPoolsResponse(pools=[pb.Pool(name="default", hits=1)], misses_by_reason={"NoMatch": 1})
    _same_shape(_shape(by_first_key["misses_by_reason"]), _shape(render.to_dict(pools)))


class _Shell:
    """One bash reading blocks from a pipe, reporting each block's end on a separate fd."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self._done_read, done_write = os.pipe()
        self.log_path = log
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=(done_write,),
            start_new_session=True,  # its own process group: everything the blocks start
        )
        os.close(done_write)
        self._send(f"set -euo pipefail\nexec {{done}}>&{done_write}\n")
        self._pending = b""

    def _send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode())
        self.process.stdin.flush()

    def run(self, path: Path, block: Block) -> None:
        # stdin from /dev/null: a command of the block must not read the next blocks.
        self._send(f'source {path} </dev/null\necho "{MARKER} $?" >&"$done"\n')
        deadline = time.monotonic() + block.timeout
        while MARKER.encode() not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"README.md:{block.line}: the block did not finish within {block.timeout:g} s\n{self.tail()}"
                )
            ready, _, _ = select.select([self._done_read], [], [], left)
            if ready:
                chunk = os.read(self._done_read, 4096)
                if not chunk:
                    code = self.process.wait(timeout=30)
                    raise AssertionError(f"README.md:{block.line}: the block failed (exit {code})\n{self.tail()}")
                self._pending += chunk
        self._pending = b""

    def tail(self, lines: int = 60) -> str:
        if not self._log.closed:
            self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "--- shell output (last lines) ---\n" + "\n".join(text[-lines:])

    def close(self) -> list[str]:
        """Exit the shell; kill whatever the blocks left running and return its command lines."""
        if self.process.poll() is None:
            self._send("exit 0\n")
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        leftovers = _group_members(self.process.pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _group_members(self.process.pid):
                break
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 10
            while _group_members(self.process.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        os.close(self._done_read)
        assert self.process.stdin is not None
        self.process.stdin.close()
        self._log.close()
        return leftovers


def _group_members(pgid: int) -> list[str]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rpartition(")")[2].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            members.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip())
        except (OSError, IndexError, ValueError):
            continue
    return members


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes, and pytest's tmp_path is long.
    with tempfile.TemporaryDirectory(prefix="readme-", dir="/tmp") as tmp:
        yield Path(tmp)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_readme_pasted_top_to_bottom(short_tmp: Path) -> None:
    blocks = [b for b in readme_blocks(README.read_text()) if b.runs]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSHELL_") and k != "VIRTUAL_ENV"}
    env |= {
        "XDG_STATE_HOME": str(short_tmp / "state"),
        "TMPDIR": str(short_tmp / "tmp"),
        "WARMSHELL_HTTP_PORT": "0",  # other gateways on this machine may hold the default port
    }
    (short_tmp / "tmp").mkdir()
    shell = _Shell(ROOT, env, short_tmp / "shell.log")
    try:
        for number, block in enumerate(blocks):
            path = short_tmp / f"block-{number:02d}-line-{block.line}.sh"
            path.write_text(block.code)
            shell.run(path, block)
    finally:
        leftovers = shell.close()
    assert not leftovers, f"the README's blocks left these running: {leftovers}\n{shell.tail()}"


@pytest.mark.slow
def test_the_python_example_runs_as_written(short_tmp: Path) -> None:
    # The SDK block is pasted into a file and run as a user would, against a gateway serving the
    # example pools (its warm creates, a cold one, a one-shot job, the async client).
    examples = [b.code for b in readme_blocks(README.read_text()) if b.language == "python"]
    assert examples, "README.md shows no Python example"
    gateway = start_gateway(short_tmp / "state", "--pools", str(ROOT / "examples" / "pools"))
    try:
        for number, code in enumerate(examples):
            script = short_tmp / f"example-{number}.py"
            script.write_text(code)
            ran = subprocess.run(
                [sys.executable, str(script)],
                cwd=short_tmp,
                env=warmshell_env(gateway.state_dir),
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert ran.returncode == 0, f"README.md's Python example {number} failed:\n{ran.stderr}\n{gateway.log()}"
    finally:
        assert gateway.stop() == 0, gateway.log()
