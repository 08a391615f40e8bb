"""The fork server's container set-up in C (``kubesim.kubelet.native``) makes the container the
Python set-up makes: the same mounts (types, read-only or not), the same files seen and hidden,
the same working directory; and a failed step ends the container with 127 and a message that
names it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kubesim.kubelet import forkserver, mountns, native

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")

# What the container sees, printed to its log (stdout) as one JSON line.
_VIEW = r"""
import json, os
rows = [line.split() for line in open("/proc/self/mountinfo")]
mounts = sorted(
    (r[4], r[r.index("-") + 1], r[5].split(",")[0]) for r in rows
)
def read(path):
    try:
        return open(path).read()
    except OSError as exc:
        return type(exc).__name__
print(json.dumps({
    "mounts": mounts,
    "cwd": os.getcwd(),
    "token": read("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    "workspace": sorted(os.listdir("/workspace")),
    "nested": read("/workspace/cache/note"),
    "hosts": read("/etc/hosts"),
    "hidden": sorted(os.listdir(os.environ["HIDDEN"])),
    "kubelet_root": sorted(os.listdir(os.environ["KUBELET_ROOT"])),
    "setsid": os.getsid(0) == os.getpid(),
    "stdin": read("/proc/self/fd/0") == "",
    "fds": sorted(os.listdir("/proc/self/fd")),
    "old_root": os.path.exists("/.kubesim-old-root"),
    "ro_token": os.statvfs("/var/run/secrets/kubernetes.io/serviceaccount").f_flag & os.ST_RDONLY != 0,
}), flush=True)
"""

# The Python set-up in a child interpreter, then the same exec; or there the C library's
# (the forked container's path, ``kubesim_container_packed``).
_PYTHON = """
import ctypes, json, sys
from kubesim.kubelet import forkserver, mountns, native
request = json.loads(sys.argv[1])
if len(sys.argv) > 2:
    top = native.top_words(mountns.refresh_host_mounts()).encode()
    native.load(native.pathlib.Path(sys.argv[2])).run(request["setup"], top)
else:
    forkserver._python_setup(request, ctypes.CDLL(None, use_errno=True))
forkserver._exec(request["argv"], request["env"])
"""


def _pod(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """A pod directory under a kubelet root, with its volumes, hosts file and mount spec."""
    root = tmp_path / "kubelet"
    pod = root / "ns_pod_12345678"
    token, workspace, cache, other = (pod / ".volumes" / name for name in ("token", "ws", "cache", "other"))
    for directory in (token, workspace, cache, other, pod / ".ns", pod / ".logs"):
        directory.mkdir(parents=True)
    (token / "token").write_text("the-token")
    (workspace / "file").write_text("w")
    (cache / "note").write_text("nested volume")
    (other / "secret").write_text("not this container's")
    (root / "another_pod").mkdir()
    (pod / ".hosts").write_text("10.0.0.7\tpod\n")
    spec = {
        "binds": [
            {"source": str(token), "target": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True},
            {"source": str(cache), "target": "/workspace/cache", "readOnly": False},
            {"source": str(workspace), "target": "/workspace", "readOnly": False},
            {"source": str(tmp_path / "gone"), "target": "/gone", "readOnly": False},
        ],
        "hosts": str(pod / ".hosts"),
        "netns": None,
        "private": {"root": str(root), "pod": str(pod)},
        "hide": [str(other), str(pod / ".logs"), str(pod / ".ns")],
        "pidns": False,
    }
    path = pod / ".ns" / "c.json"
    path.write_text(json.dumps(spec))
    return spec, path


def _request(pod: Path, spec: dict[str, Any], spec_path: Path, log: str, argv: list[str]) -> dict[str, Any]:
    env = {"PATH": os.environ["PATH"], "HIDDEN": str(pod / ".volumes" / "other"), "KUBELET_ROOT": str(pod.parent)}
    words = native.start_words(
        log=str(pod / log), cwd=str(pod), mounts=native.mount_words(spec, spec_path), pid_namespace=False
    )
    return {"argv": argv, "env": env, "cwd": str(pod), "log": str(pod / log), "mounts": str(spec_path)} | {
        "pidns": False,
        "setup": words,
    }


def _run_all(tmp_path: Path, argv: list[str]) -> dict[str, tuple[int, str]]:
    """The container ``argv`` set up by the program, the library and Python: each one's status
    and log."""
    spec, spec_path = _pod(tmp_path)
    pod = spec_path.parent.parent
    cache = tmp_path / "cache"
    setup = native.load(cache)
    top = native.top_words(mountns.refresh_host_mounts())
    runs = {}
    request = _request(pod, spec, spec_path, "program.log", argv)
    words = [*request["setup"].split("\0"), *top.split("\0")]
    runs["program"] = subprocess.run([setup.program, str(len(words)), *words, *argv], env=request["env"], check=False)
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for name, extra in (("library", [str(cache)]), ("python", [])):
        request = _request(pod, spec, spec_path, f"{name}.log", argv)
        command = [sys.executable, "-c", _PYTHON, json.dumps(request), *extra]
        runs[name] = subprocess.run(command, env=child_env, timeout=60, check=False)
    return {name: (done.returncode, (pod / f"{name}.log").read_text()) for name, done in runs.items()}


def test_the_c_set_up_makes_the_container_the_python_one_makes(tmp_path: Path) -> None:
    runs = _run_all(tmp_path, [sys.executable, "-c", _VIEW])
    assert [code for code, _ in runs.values()] == [0, 0, 0], runs
    c_view, library_view, py_view = (json.loads(log) for _, log in runs.values())
    assert c_view == py_view
    assert library_view == py_view
    # And it is the container asked for, not two equal wrong ones.
    assert c_view["token"] == "the-token"
    assert c_view["ro_token"]
    assert c_view["workspace"] == ["cache", "file"]
    assert c_view["nested"] == "nested volume"
    assert c_view["hosts"] == "10.0.0.7\tpod\n"
    assert not c_view["old_root"]  # the host's root is detached, not left reachable
    assert c_view["hidden"] == []
    assert c_view["kubelet_root"] == ["ns_pod_12345678"]
    assert c_view["setsid"]
    assert c_view["stdin"]
    assert c_view["fds"] == ["0", "1", "2", "3"]
    # A devpts of its own on top of whatever the host has there.
    host = sum(1 for line in Path("/proc/self/mountinfo").read_text().splitlines() if line.split()[4] == "/dev/pts")
    assert sum(1 for m in c_view["mounts"] if m[:2] == ["/dev/pts", "devpts"]) == host + 1


def test_a_program_that_cannot_run_ends_the_container_with_127_and_says_why(tmp_path: Path) -> None:
    runs = _run_all(tmp_path, ["/no/such/program"])
    assert [code for code, _ in runs.values()] == [127, 127, 127]
    for _, log in runs.values():
        assert "cannot run '/no/such/program'" in log
        assert "No such file or directory" in log


def test_a_failed_step_names_itself(tmp_path: Path) -> None:
    setup = native.load(tmp_path / "cache")
    log = tmp_path / "log"
    words = ["log", str(log), "cwd", str(tmp_path), "netns", str(tmp_path / "no-such-namespace")]
    done = subprocess.run([setup.program, str(len(words)), *words, "true"], timeout=60, check=False)
    assert done.returncode == 127
    assert f"setns({tmp_path / 'no-such-namespace'})" in log.read_text()
    done = subprocess.run([setup.program, "2", "bogus", "word", "true"], capture_output=True, timeout=60, check=False)
    assert done.returncode == 127
    assert b"set-up word 'bogus'" in done.stderr


async def test_without_a_c_compiler_the_fork_server_sets_containers_up_in_python(tmp_path: Path) -> None:
    spec, spec_path = _pod(tmp_path)
    pod = spec_path.parent.parent
    env = {"PATH": os.environ["PATH"], "KUBESIM_CACHE": str(tmp_path / "empty"), "CC": str(tmp_path / "no-cc")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    server = forkserver.ForkServer((), env=env)
    try:
        proc = await server.spawn_exec(
            ["sh", "-c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token"],
            env={"PATH": os.environ["PATH"]},
            cwd=pod,
            log_path=pod / "fallback.log",
            mounts=spec_path,
            mount_words=native.mount_words(spec, spec_path),
            pid_namespace=False,
        )
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await server.aclose()
    assert (pod / "fallback.log").read_text() == "the-token"
    assert not (tmp_path / "empty").exists(), "nothing was compiled"


def _processes_with(argument: bytes) -> list[int]:
    """Host processes with `argument` among their command line's words."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if argument in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_a_start_stopped_before_its_pid_is_reported_leaves_no_container_running(tmp_path: Path) -> None:
    """A pod stopped while its container's start waits for the fork server's report (its task
    cancelled) no longer knows that container: the report must not start it for good."""
    spec, spec_path = _pod(tmp_path)
    pod = spec_path.parent.parent
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path)}
    server = forkserver.ForkServer((), env=env)
    marker = f"600.{os.getpid()}{abs(hash(tmp_path)) % 10_000}"  # a sleep no other test runs

    def start(argv: list[str]) -> Any:
        words = native.mount_words(spec, spec_path)
        return server.spawn_exec(
            argv, env=env, cwd=pod, log_path=pod / "c.log", mounts=spec_path, mount_words=words, pid_namespace=False
        )

    try:
        assert await asyncio.wait_for((await start(["true"])).wait(), 60) == 0  # the server is up
        starting = asyncio.create_task(start(["sleep", marker]))
        for _ in range(3):  # to its wait for the report: the request is written by then
            await asyncio.sleep(0)
        assert not starting.done()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        # The server answers in order: once a later start has run, this one was reported too.
        assert await asyncio.wait_for((await start(["true"])).wait(), 60) == 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10  # a SIGKILL and the server's reaping, on a loaded host
        while _processes_with(marker.encode()):
            assert loop.time() < deadline, "the abandoned container runs on"
            await asyncio.sleep(0.05)
    finally:
        await server.aclose()
