"""`warmshell sandbox cp` and `sandbox ls` as a user types them, against a real gateway process
with real bwrap'd sandboxes: both directions, binary data, listings, and the exit codes of the
failures a user meets."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import CliGateway, start_gateway


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[CliGateway]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    running = start_gateway(tmp_path / "state")
    try:
        created = running.run("sandbox", "create", "--name", "box")
        assert created.returncode == 0, created.stderr + running.log()
        yield running
    finally:
        status = running.stop()
        assert status == 0, f"gateway exited with {status} after SIGTERM:\n{running.log()}"


def test_cp_in_and_out_and_ls(gateway: CliGateway, tmp_path: Path) -> None:
    local = tmp_path / "data.bin"
    data = os.urandom(3 * 1024 * 1024 + 17)
    local.write_bytes(data)
    local.chmod(0o750)
    put = gateway.run("sandbox", "cp", str(local), "box:/workspace/in/data.bin")
    assert (put.returncode, put.stdout, put.stderr) == (0, "", "")
    # The workload sees it, with the local file's mode; a relative path is under /workspace.
    seen = gateway.run("sandbox", "exec", "box", "--", "sh", "-c", "wc -c < in/data.bin; stat -c %a in/data.bin")
    assert seen.stdout.split() == [str(len(data)), "750"], seen.stderr

    back = tmp_path / "back.bin"
    got = gateway.run("sandbox", "cp", "box:in/data.bin", str(back), "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"destination": str(back), "bytes": len(data)}
    assert back.read_bytes() == data
    # Into a local directory, and to a sandbox directory with a trailing slash: the name is kept.
    into = tmp_path / "into"
    into.mkdir()
    assert gateway.run("sandbox", "cp", "box:/workspace/in/data.bin", str(into)).returncode == 0
    assert (into / "data.bin").read_bytes() == data
    assert gateway.run("sandbox", "cp", str(local), "box:/workspace/in/").returncode == 0

    listed = gateway.run("sandbox", "ls", "box", "in")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["MODE", "SIZE", "MODIFIED", "NAME"]
    assert [r[0] for r in rows[1:]] == ["-rwxr-x---"]
    assert [r[1] for r in rows[1:]] == [str(len(data))]
    assert [r[-1] for r in rows[1:]] == ["data.bin"]
    gateway.run("sandbox", "exec", "box", "--", "ln", "-s", "in/data.bin", "/workspace/link")
    as_json = gateway.run("sandbox", "ls", "box", "-o", "json")
    entries = {e["name"]: e for e in json.loads(as_json.stdout)}
    assert entries["in"]["type"] == "directory"
    assert (entries["link"]["type"], entries["link"]["link_target"]) == ("symlink", "in/data.bin")


def test_cp_and_ls_failures(gateway: CliGateway, tmp_path: Path) -> None:
    missing = gateway.run("sandbox", "cp", "box:/workspace/nope", str(tmp_path / "x"))
    assert missing.returncode == 3
    assert missing.stderr.startswith("error: /workspace/nope: no such file")
    assert not (tmp_path / "x").exists()
    assert not list(tmp_path.glob(".x*"))  # no partial file left behind
    local_missing = gateway.run("sandbox", "cp", str(tmp_path / "absent"), "box:/workspace/a")
    assert local_missing.returncode == 3
    assert str(tmp_path / "absent") in local_missing.stderr
    both_local = gateway.run("sandbox", "cp", str(tmp_path / "a"), str(tmp_path / "b"))
    assert both_local.returncode == 2
    assert "exactly one of SOURCE and DESTINATION" in both_local.stderr
    readonly = gateway.run("sandbox", "cp", str(Path(__file__)), "box:/usr/bin/planted")
    assert readonly.returncode == 8  # permission denied, not 77 (a wrong token)
    assert "read-only" in readonly.stderr
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (17 * 1024 * 1024))  # /run is a 16 MiB tmpfs
    full = gateway.run("sandbox", "cp", str(big), "box:/run/big.bin")
    assert full.returncode == 9, full.stderr  # resource exhausted, not 5 (invalid argument)
    assert "no space left" in full.stderr
    gateway.run("sandbox", "exec", "box", "--", "ln", "-s", "/nowhere", "/workspace/dangling")
    dangling = gateway.run("sandbox", "cp", str(Path(__file__)), "box:/workspace/dangling/file")
    assert dangling.returncode == 3, dangling.stderr  # not 4: nothing "already exists"
    assert "symbolic link on the path points to nothing" in dangling.stderr
    not_dir = gateway.run("sandbox", "ls", "box", "/etc/passwd")
    assert not_dir.returncode == 6
    assert "not a directory" in not_dir.stderr
    no_box = gateway.run("sandbox", "ls", "ghost")
    assert no_box.returncode == 3


def test_cp_recursive_both_ways(gateway: CliGateway, tmp_path: Path) -> None:
    """A thirteen-file repository with a 5 MiB blob in one call each way, as `cp -r` copies:
    into an existing directory under the source's name, else as the destination."""
    repo = tmp_path / "repo"
    for i in range(12):
        (repo / "src" / f"m{i % 3}").mkdir(parents=True, exist_ok=True)
        (repo / "src" / f"m{i % 3}" / f"f{i}.py").write_text(f"x = {i}\n")
    (repo / "blob.bin").write_bytes(os.urandom(5 * 1024 * 1024))
    (repo / "run.sh").write_text("#!/bin/sh\necho ran\n")  # the 14th file: an executable
    (repo / "run.sh").chmod(0o755)
    (repo / "latest").symlink_to("src/m0")
    put = gateway.run("sandbox", "cp", "-r", str(repo), "box:/workspace/", "-o", "json")
    assert put.returncode == 0, put.stderr
    assert json.loads(put.stdout) == {
        "destination": "box:/workspace/repo",
        "entries": 19,
        "bytes": sum(p.stat().st_size for p in repo.rglob("*") if p.is_file() and not p.is_symlink()),
    }
    ran = gateway.run("sandbox", "exec", "box", "--", "sh", "-c", "repo/run.sh; ls repo/latest/")
    assert ran.stdout.split() == ["ran", "f0.py", "f3.py", "f6.py", "f9.py"], ran.stderr

    back = tmp_path / "back"
    got = gateway.run("sandbox", "cp", "--recursive", "box:repo", str(back))
    assert (got.returncode, got.stdout) == (0, ""), got.stderr
    assert (back / "blob.bin").read_bytes() == (repo / "blob.bin").read_bytes()
    assert os.readlink(back / "latest") == "src/m0"
    assert (back / "run.sh").stat().st_mode & 0o777 == 0o755
    # Into an existing directory: under the source's name.
    into = tmp_path / "into"
    into.mkdir()
    assert gateway.run("sandbox", "cp", "-r", "box:repo/src", str(into)).returncode == 0
    assert (into / "src" / "m1" / "f4.py").read_text() == "x = 4\n"
    # Without -r a directory is refused with the hint to use it.
    plain = gateway.run("sandbox", "cp", str(repo), "box:/workspace/other")
    assert plain.returncode == 5
    assert "sandbox cp -r" in plain.stderr
