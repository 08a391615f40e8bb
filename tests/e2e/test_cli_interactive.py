"""`warmshell sandbox exec -it` and `-i` as a user types them: the CLI runs on a real
pseudo-terminal of this test (its controlling terminal), against a real gateway with bwrap'd
sandboxes. The sandbox's shell sees its own terminal and the client's size, follows a resize of
the client's terminal, Ctrl-C interrupts the foreground command there, the exit code comes back,
and the client's terminal is left as it was, with nothing injected into it. Without -t, a pipe is
streamed to the command and a SIGINT to the CLI reaches the command. SIGTERM restores the terminal
as Ctrl-C does, and a CLI whose reader went away (`| head -1`) ends quietly."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import CliGateway, start_gateway, warmshell_env, warmshell_executable
from tests.helpers.prelude import after_prelude


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    running = start_gateway(tmp_path_factory.mktemp("interactive") / "state")
    try:
        created = running.run("sandbox", "create", "--name", "box")
        assert created.returncode == 0, created.stderr + running.log()
        yield running
    finally:
        status = running.stop()
        assert status == 0, f"gateway exited with {status} after SIGTERM:\n{running.log()}"


def set_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


class Terminal:
    """The CLI on a fresh pseudo-terminal: `master` is the keyboard and the screen."""

    def __init__(self, gateway: CliGateway, *args: str, rows: int = 33, columns: int = 111) -> None:
        self.master, self.slave = os.openpty()
        set_size(self.master, rows, columns)
        self.initial_modes = termios.tcgetattr(self.slave)
        slave = self.slave

        # A session of its own (start_new_session), this pty its controlling terminal.
        take_terminal = "import fcntl, termios\nfcntl.ioctl(0, termios.TIOCSCTTY, 0)"
        self.process = subprocess.Popen(
            after_prelude(take_terminal, [warmshell_executable(), *args]),
            env=warmshell_env(gateway.state_dir),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        self.screen = b""

    def type(self, keys: bytes | str) -> None:
        os.write(self.master, keys.encode() if isinstance(keys, str) else keys)

    def expect(self, pattern: bytes, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while not (found := re.search(pattern, self.screen)):
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} on the screen: {self.screen!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.screen += os.read(self.master, 65536)
                except OSError:  # EIO: the CLI exited and closed the terminal
                    raise AssertionError(f"the CLI exited before {pattern!r}: {self.screen!r}") from None
        return found.group(0)

    def wait(self) -> int:
        return self.process.wait(30)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)
        os.close(self.slave)


def test_exec_it_is_a_terminal_in_the_sandbox(gateway: CliGateway) -> None:
    term = Terminal(gateway, "sandbox", "exec", "-it", "box", "--", "sh")
    try:
        term.expect(rb"[#$] ")  # the sandbox's shell prompts
        term.type("tty; stty size\n")
        term.expect(rb"/dev/pts/\d+\r\n")
        term.expect(rb"33 111\r\n")  # the client's size, as the sandbox's terminal
        # Resizing the client's terminal sends the CLI SIGWINCH; it forwards the new size.
        set_size(term.master, 40, 90)
        os.killpg(term.process.pid, signal.SIGWINCH)  # as the kernel does for a foreground group
        time.sleep(0.5)
        term.type("stty size\n")
        term.expect(rb"40 90\r\n")
        # Ctrl-C is a key like any other in raw mode: the sandbox's terminal interrupts sleep.
        term.type("sleep 100\n")
        time.sleep(0.5)
        started = time.monotonic()
        term.type(b"\x03")
        term.type("echo rc=$?\n")
        term.expect(rb"rc=130")
        assert time.monotonic() - started < 10
        term.type("exit 3\n")
        assert term.wait() == 3
        # The client's terminal is back in the mode it had (raw mode undone).
        assert termios.tcgetattr(term.slave) == term.initial_modes
    finally:
        term.close()


def test_a_workload_cannot_type_into_the_clients_terminal(gateway: CliGateway) -> None:
    """TIOCSTI from inside reaches only the sandbox's own terminal: the injected line runs in the
    sandbox, and the client's terminal has nothing waiting to be read once the CLI is gone."""
    script = (
        "import fcntl, termios\nfor c in b'echo INJ$((6*7))\\n':\n    fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))\n"
    )
    written = gateway.run(
        "sandbox", "exec", "-i", "box", "--", "sh", "-c", "cat > /tmp/inject.py", stdin=script.encode()
    )
    assert written.returncode == 0, written.stderr
    term = Terminal(gateway, "sandbox", "exec", "-it", "box", "--", "sh")
    try:
        term.type("python3 /tmp/inject.py\n")
        term.expect(rb"INJ42\r\n")
        term.type("exit\n")
        assert term.wait() == 0
        waiting = struct.unpack("i", fcntl.ioctl(term.slave, termios.FIONREAD, b"\0\0\0\0"))[0]
        assert waiting == 0, "something was injected into the client's terminal"
    finally:
        term.close()


def test_exec_i_streams_a_pipe(gateway: CliGateway, tmp_path: Path) -> None:
    data = os.urandom(1024 * 1024) * 64  # 64 MiB through a pipe
    source = tmp_path / "big"
    source.write_bytes(data)
    with source.open("rb") as stdin:
        done = subprocess.run(
            [warmshell_executable(), "sandbox", "exec", "-i", "box", "--", "sh", "-c", "sha256sum; exit 4"],
            env=warmshell_env(gateway.state_dir),
            stdin=stdin,
            capture_output=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 4, done.stderr
    assert done.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_exec_i_forwards_sigint_to_the_command(gateway: CliGateway) -> None:
    script = "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.1; done"
    with subprocess.Popen(
        [warmshell_executable(), "sandbox", "exec", "-i", "box", "--", "sh", "-c", script],
        env=warmshell_env(gateway.state_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == b"ready\n"
            process.send_signal(signal.SIGINT)
            assert process.stdout.readline() == b"got-int\n"
            assert process.wait(30) == 5
        finally:
            if process.poll() is None:
                process.kill()


def test_sigterm_restores_the_terminal_as_ctrl_c_does(gateway: CliGateway) -> None:
    term = Terminal(gateway, "sandbox", "exec", "-it", "box", "--", "sh")
    try:
        term.expect(rb"[#$] ")
        assert termios.tcgetattr(term.slave) != term.initial_modes  # raw while the session runs
        term.type("echo $$ > /tmp/shell.pid; sleep 100\n")
        time.sleep(0.5)
        term.process.send_signal(signal.SIGTERM)
        assert term.wait() == 128 + signal.SIGTERM
        assert termios.tcgetattr(term.slave) == term.initial_modes
        # The session's command was stopped with it.
        alive = gateway.run("sandbox", "exec", "box", "--", "sh", "-c", 'kill -0 "$(cat /tmp/shell.pid)"')
        assert alive.returncode != 0, alive.stdout
    finally:
        term.close()


@pytest.mark.parametrize(
    "command",
    [["sandbox", "get", "box"], ["sandbox", "exec", "box", "--", "sh", "-c", "seq 100000"]],
    ids=["get", "exec"],
)
def test_a_reader_that_goes_away_ends_the_cli_quietly(gateway: CliGateway, command: list[str]) -> None:
    """`warmshell sandbox get NAME | head -1`: the CLI's output has no reader left, which ends it
    as SIGPIPE ends a program (exit 141), with no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: no race with the output
    try:
        ran = subprocess.run(
            [warmshell_executable(), *command],
            env=warmshell_env(gateway.state_dir),
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert ran.returncode == 128 + signal.SIGPIPE, ran.stderr
    assert ran.stderr == b""
