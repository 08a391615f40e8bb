"""Issue 14: the cost of one local pool member's start, without a gateway around it.

    python bench/investigations/member-start/member_start.py [--count 200] [--repeat 5] [--before-src DIR] [--rounds 40]
                                 [--host-tasks 0,2000 --task-rounds 30]

Two parts, in one run:

- **launcher**: the driver's `Launcher` in a fresh process (the gateway's configuration: staged
  /etc, default bounds, a uid per sandbox when run as root) starts members `--concurrency` at a
  time (the pools' spawn slots) until `--count` agents said hello: members/s, that process's CPU
  per start (what the gateway spends: preparing, spawning, waiting for the hello; its event loop
  and its other threads apart, from `/proc/self/task/*/schedstat`), and the member's own
  processes' CPU up to its hello (bwrap and the agent, from their schedstat while they run). Then
  all are stopped and the member processes' CPU over their whole life (`RUSAGE_CHILDREN`: teardown
  of the namespaces included) is reported too. Work the kernel defers to its own threads (a
  network namespace is freed by a kworker) is in neither figure. No host-side supervisor runs:
  that is the gateway's other share of a member start (`bench/burst.py` measures the sum).
  `--repeat` runs, alternating with as many of the warmshell package under `--before-src DIR`
  (e.g. `git archive <commit> src` with its agent and launcher built by `scripts/build-agent`).
- **flags**: one member start and stop (the driver's bwrap command line with the real agent as
  pid 1, its control socket closed at once so it exits after its hello) in alternating rounds:
  the command line as the driver builds it, then with one step removed (or a step of the previous
  layout added back) at a time. A removed step is a measurement, not a proposal: every isolating
  flag stays. CPU from `wait4` (bwrap and everything it waited for).
- **host tasks**: the same start and stop with `N` more (idle, sleeping) processes on the host,
  for each `N` of `--host-tasks`, the driver's command line alternating with the same line
  running the `--before-src` tree's agent: what a start and a stop cost grows with every process
  on the host (`pivot_root` walks every thread, `chroot_fs_refs`; the agent's `kill(-1)` at its
  end walked every process), and a pool of 1,000 members is 2,000 of them.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from burst import cpu_ns, thread_ns
from harness import summary, write_results
from warm_path import descendants

from warmshell.core.config import LocalDriverConfig
from warmshell.drivers.local.instances import Instance
from warmshell.drivers.local.runtime import launching, limits, sandboxing, seccomp
from warmshell.drivers.local.runtime.processes import HostProcesses, SandboxProcess

UID_BASE = 2_100_000
AGENT = sandboxing.AGENT_PATH
# How a sandbox entered its cgroup before warmshell-launch did it (a shell that moves itself, then execs).
SH_CGROUP = ["/bin/sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "warmshell-cgroup"]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def self_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def children_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def make_launcher(tmp: Path) -> launching.Launcher:
    root = os.geteuid() == 0
    stage = tmp / "stage"
    stage.mkdir(mode=0o711)
    return launching.Launcher(
        bwrap=shutil.which("bwrap"),
        stage_dir=stage if root else None,
        bounds=limits.Bounds.of(LocalDriverConfig()),
        etc_dir=stage / "etc" if root else tmp / "etc",
    )


async def launcher_run(count: int, concurrency: int, nice: int) -> dict[str, Any]:
    """Start `count` members, `concurrency` at a time, as the pools do; then stop them."""
    root = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="ws-member-") as name:
        tmp = Path(name)
        tmp.chmod(0o711)
        launcher = make_launcher(tmp)
        await asyncio.to_thread(launcher.prepare, "")  # the first start's staging is not a member's cost
        slots = asyncio.Semaphore(concurrency)
        started: list[SandboxProcess] = []

        async def one(index: int) -> None:
            async with slots:
                instance_id = f"li-bench{index:05d}"
                instance = Instance(instance_id, "", instance_id, tmp / "sb" / instance_id, 0)

                def prepare() -> None:  # as `Fleet._prepare` does for a member with a tmpfs workspace
                    instance.directory.mkdir(mode=0o700, parents=True)
                    launcher.prepare("")

                uid = UID_BASE + index if root else None
                process = await start_member(launcher, instance, uid, nice, prepare)
                assert isinstance(process, SandboxProcess)
                started.append(process)

        gateway_before, threads_before, children_before = self_ms(), thread_ns(os.getpid()), children_ms()
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        wall = time.perf_counter() - start
        gateway, threads = self_ms() - gateway_before, thread_ns(os.getpid())
        members = descendants(os.getpid())
        member_at_hello = sum(cpu_ns(pid) for pid in members) / 1e6
        stop_before = self_ms()
        await asyncio.gather(*(process.stop(2.0) for process in started))
        stop_gateway = self_ms() - stop_before
        lifetime = children_ms() - children_before
        await asyncio.to_thread(launcher.close)
    return {
        "count": count,
        "concurrency": concurrency,
        "nice": nice,
        "wall_s": wall,
        "members_per_s": count / wall,
        "gateway_cpu_ms_per_start": gateway / count,
        "gateway_loop_cpu_ms_per_start": (threads["main"] - threads_before["main"]) / 1e6 / count,
        "gateway_threads_cpu_ms_per_start": (threads["other"] - threads_before["other"]) / 1e6 / count,
        "member_cpu_ms_per_start": member_at_hello / count,
        "processes_per_member": len(members) / count,
        "member_cpu_ms_per_life": lifetime / count,
        "gateway_cpu_ms_per_stop": stop_gateway / count,
        "load": load(),
    }


async def start_member(
    launcher: launching.Launcher, instance: Instance, uid: int | None, nice: int, prepare: Callable[[], None]
) -> SandboxProcess | HostProcesses:
    """As `Fleet.launch` starts a sandbox: prepared in the spawner thread where the launcher takes
    a `prepare` (since this stop), in a thread of its own before that."""
    if "prepare" in inspect.signature(launcher.start).parameters:
        return await launcher.start(instance, image="", uid=uid, nice=nice, prepare=prepare)
    await asyncio.to_thread(prepare)
    return await launcher.start(instance, image="", uid=uid, nice=nice)


def driver_argv(tmp: Path) -> list[str]:
    """The driver's full command line for one member (launch prefix, bwrap, the agent on fd 3)."""
    root = os.geteuid() == 0
    launcher = make_launcher(tmp)
    launcher.prepare("")
    layout = sandboxing.SandboxLayout(
        bwrap=shutil.which("bwrap") or "bwrap",
        plan=launcher._plans[Path("/")],  # the plan the launcher made, as it uses it
        workspace_dir=tmp / "unused",
        agent=launching.AGENT_BINARY,
        control_fd=3,
        seccomp_fd=4,
        hostname="bench",
        instance_id="li-bench",
        **layout_sizes(limits.Bounds.of(LocalDriverConfig())),
    )
    prefix = launcher._launch_argv(19, UID_BASE if root else None, limits.Bounds.of(LocalDriverConfig()))
    return [*prefix, *sandboxing.bwrap_argv(layout)]


def layout_sizes(bounds: limits.Bounds) -> dict[str, int | None]:
    return {
        "workspace_bytes": bounds.workspace_bytes,
        "tmp_bytes": bounds.tmp_bytes,
        "run_bytes": bounds.run_bytes,
        "shm_bytes": bounds.shm_bytes,
    }


def without(argv: list[str], flag: str, arity: int, match: Callable[[list[str]], bool] = lambda _: True) -> list[str]:
    """`argv` without every `flag` (and its `arity` arguments) whose arguments `match`."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == flag and match(argv[i + 1 : i + 1 + arity]):
            i += arity + 1
            continue
        out.append(argv[i])
        i += 1
    return out


def without_sized_tmpfs(argv: list[str], target: str) -> list[str]:
    i = argv.index(target)
    return argv[: i - 3] + argv[i + 1 :] if argv[i - 3] == "--size" else argv[: i - 1] + argv[i + 1 :]


def flag_variants(argv: list[str]) -> dict[str, list[str]]:
    split = argv.index("/usr/bin/bwrap") if "/usr/bin/bwrap" in argv else argv.index(shutil.which("bwrap") or "")
    prefix, bwrap = argv[:split], argv[split:]
    at = bwrap.index("/etc") + 1  # after the staged /etc's bind: the allowed directories bound over it
    copied = [n for n in sandboxing.ETC_ALLOWED if os.path.isdir(f"/etc/{n}") and f"/etc/{n}" not in bwrap]
    subdirs = [["--ro-bind", f"/etc/{n}", f"/etc/{n}"] for n in copied]
    etc_subdirs = bwrap[:at] + [a for bind in subdirs for a in bind] + bwrap[at:]
    no_dev = without(
        without_sized_tmpfs(without(bwrap, "--dev", 1), "/dev/shm"), "--remount-ro", 1, lambda a: a == ["/dev"]
    )
    variants = {
        "as the driver builds it": argv,
        "- warmshell-launch (priority, rlimits, uid)": bwrap,
        "+ the copied /etc directories bound one each (before this stop)": prefix + etc_subdirs,
        "- --unshare-net": prefix + without(bwrap, "--unshare-net", 0),
        "- --seccomp": prefix + without(bwrap, "--seccomp", 1),
        "- --proc": prefix + without(bwrap, "--proc", 1),
        "- --dev, /dev/shm, its remount": prefix + no_dev,
        "- --remount-ro /": prefix + without(bwrap, "--remount-ro", 1, lambda a: a == ["/"]),
        "- the agent's bind (exec'd from /usr)": prefix + without(bwrap, "--ro-bind", 2, lambda a: a[1] == AGENT),
        "- the sizes of the tmpfs mounts": prefix + without(bwrap, "--size", 1),
        "+ entering a cgroup: warmshell-launch --cgroup (cgroup v2 hosts, now)": [
            prefix[0], f"--cgroup={os.devnull}", *prefix[1:], *bwrap
        ],
        "+ entering a cgroup: a /bin/sh prefix (cgroup v2 hosts, before)": [*SH_CGROUP, os.devnull, *argv],
    }  # fmt: skip
    if sandboxing.AGENT_PATH in variants["- the agent's bind (exec'd from /usr)"]:
        agent_moved = variants["- the agent's bind (exec'd from /usr)"]
        agent_moved[-2:] = ["/usr/bin/true"]
    return variants


def one_start(argv: list[str], program: bytes) -> float:
    """Start and end one member with this command line; CPU ms of its processes (wait4)."""
    host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read, write = os.pipe()
    os.write(write, program)
    os.close(write)
    argv = [str(read) if i and argv[i - 1] == "--seccomp" else a for i, a in enumerate(argv)]
    if argv[-2] == sandboxing.AGENT_PATH:
        argv[-1] = str(child.fileno())
    process = subprocess.Popen(argv, pass_fds=(child.fileno(), read), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    child.close()
    os.close(read)
    host.recv(16)  # the agent's hello (nothing for /usr/bin/true: it exits, and recv returns b"")
    host.close()  # the agent ends the sandbox
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise RuntimeError(f"exit {status}: {process.stderr.read() if process.stderr else ''}: {argv}")
    if process.stderr:
        process.stderr.close()
    return (usage.ru_utime + usage.ru_stime) * 1000


def flags_run(rounds: int) -> dict[str, Any]:
    program = seccomp.program()
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="ws-member-flags-") as name:
        tmp = Path(name)
        tmp.chmod(0o711)
        variants = flag_variants(driver_argv(tmp))
        for _ in range(rounds):
            for label, argv in variants.items():
                samples.setdefault(label, []).append(one_start(argv, program))
    return {"rounds": rounds, "cpu_ms": {label: summary(values) for label, values in samples.items()}, "load": load()}


def host_processes() -> int:
    return sum(1 for entry in os.listdir("/proc") if entry.isdigit())


def host_tasks_run(levels: list[int], rounds: int, before_src: Path | None) -> dict[str, Any]:
    """Start + stop CPU with `N` extra sleeping processes on the host, for each `N` of `levels`:
    the driver's command line, and (with `before_src`) the same line with that tree's agent."""
    program = seccomp.program()
    out: dict[str, Any] = {"rounds": rounds, "levels": []}
    with tempfile.TemporaryDirectory(prefix="ws-member-tasks-") as name:
        tmp = Path(name)
        tmp.chmod(0o711)
        argv = driver_argv(tmp)
        variants = {"now": argv}
        if before_src is not None:
            agent = str(before_src / "warmshell" / "drivers" / "local" / "agent" / "warmshell-agent")
            at = argv.index(sandboxing.AGENT_PATH) - 1  # the agent's bind source
            variants["the before tree's agent"] = [*argv[:at], agent, *argv[at + 1 :]]
        sleepers: list[subprocess.Popen[bytes]] = []
        try:
            for level in levels:
                while len(sleepers) > level:
                    sleepers.pop().kill()
                while len(sleepers) < level:
                    sleepers.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
                samples: dict[str, list[float]] = {label: [] for label in variants}
                processes = [host_processes()]  # other users' processes come and go too: before and after
                for _ in range(rounds):
                    for label, line in variants.items():
                        samples[label].append(one_start(line, program))
                processes.append(host_processes())
                cpu = {label: summary(values) for label, values in samples.items()}
                out["levels"].append({"extra": level, "processes": processes, "cpu_ms": cpu, "load": load()})
        finally:
            for sleeper in sleepers:
                sleeper.kill()
                sleeper.wait()
    return out


LAUNCHER_METRICS = (
    ("members_per_s", "members/s", 1),
    ("gateway_cpu_ms_per_start", "gateway CPU ms/start", 2),
    ("gateway_loop_cpu_ms_per_start", "… its event loop", 2),
    ("gateway_threads_cpu_ms_per_start", "… its threads (spawner)", 2),
    ("member_cpu_ms_per_start", "member CPU ms to hello (bwrap, agent)", 2),
    ("member_cpu_ms_per_life", "member CPU ms over its life", 2),
    ("gateway_cpu_ms_per_stop", "gateway CPU ms/stop", 2),
)


def launcher_runs(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """`--repeat` launcher runs of each source tree (this one, and `--before-src` if given),
    alternating, each in a fresh process so the two never share an interpreter."""
    trees = {"now": None, **({"before": args.before_src} if args.before_src else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="ws-member-runs-") as tmp:
        for repeat in range(args.repeat):
            for name, src in trees.items():
                out = Path(tmp, f"{name}-{repeat}.json")
                env = {**os.environ, **({"PYTHONPATH": str(src)} if src else {})}
                command = [sys.executable, __file__, "--one-run", str(out), "--count", str(args.count)]
                subprocess.run([*command, "--concurrency", str(args.concurrency)], env=env, check=True)
                runs[name].append(json.loads(out.read_text()))
    return runs


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key, _, _ in LAUNCHER_METRICS}


def launcher_table(data: dict[str, Any]) -> str:
    runs = data["launcher"]
    now = medians(runs["now"])
    before = medians(runs["before"]) if "before" in runs else None
    repeat = len(runs["now"])
    out = f"Launcher, no supervisor: {data['count']} members started {data['concurrency']} at a time, nice 0; "
    out += f"median of {repeat} runs{' of each tree, alternating' if before else ''}.\n\n"
    out += "| figure | now |" + (" before | now / before |" if before else "") + "\n"
    out += "|---|---|" + ("---|---|" if before else "") + "\n"
    for key, label, digits in LAUNCHER_METRICS:
        out += f"| {label} | {now[key]:.{digits}f} |"
        if before:
            out += f" {before[key]:.{digits}f} | {now[key] / before[key]:.2f} |" if before[key] else " - | - |"
        out += "\n"
    loads = [run["load"][0] for tree in runs.values() for run in tree]
    out += f"\n(1-minute load during the runs {min(loads)}-{max(loads)}: a shared 2-core machine)\n"
    return out


def table(data: dict[str, Any]) -> str:
    out = launcher_table(data) if data["launcher"]["now"] else ""
    flags = data.get("flags")
    if flags:
        base = flags["cpu_ms"]["as the driver builds it"]["p50"]
        out += f"\n| one member start + stop ({flags['rounds']} alternating rounds) | CPU p50 ms | vs the driver's |\n"
        out += "|---|---|---|\n"
        for label, cpu in flags["cpu_ms"].items():
            out += f"| {label} | {cpu['p50']:.2f} | {cpu['p50'] - base:+.2f} |\n"
        out += f"\n(load {flags['load']}; a shared 2-core machine: compare within a run)\n"
    tasks = data.get("host_tasks")
    if tasks:
        labels = list(tasks["levels"][0]["cpu_ms"])
        out += f"\n| one member start + stop, CPU p50 ms ({tasks['rounds']} alternating rounds) | "
        out += " | ".join(labels) + " | load |\n|---|" + "---|" * (len(labels) + 1) + "\n"
        for level in tasks["levels"]:
            cells = [f"{level['cpu_ms'][label]['p50']:.2f}" for label in labels]
            low, high = level["processes"]
            out += f"| {level['extra']} more processes on the host ({low}-{high} in all) | "
            out += " | ".join(cells) + f" | {level['load'][0]} |\n"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200, help="members started per launcher run (default 200)")
    parser.add_argument("--concurrency", type=int, default=8, help="starts in flight (default 8, the pools' slots)")
    parser.add_argument("--repeat", type=int, default=5, help="launcher runs per source tree (default 5)")
    parser.add_argument("--before-src", type=Path, help="also run the launcher of the warmshell package under DIR")
    parser.add_argument("--rounds", type=int, default=40, help="alternating rounds of the flag breakdown (0: skip)")
    parser.add_argument("--host-tasks", default="0,2000", help="extra idle processes on the host, per level")
    parser.add_argument("--task-rounds", type=int, default=30, help="alternating rounds per host-tasks level (0: skip)")
    parser.add_argument("--name", default="member_start", help="writes results/NAME.{json,md} beside this script")
    parser.add_argument("--one-run", type=Path, help=argparse.SUPPRESS)  # a launcher run's figures, as JSON
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("bubblewrap is needed")
    if args.one_run:
        args.one_run.write_text(json.dumps(asyncio.run(launcher_run(args.count, args.concurrency, 0))))
        return
    data: dict[str, Any] = {"load_start": load(), "count": args.count, "concurrency": args.concurrency}
    data["launcher"] = launcher_runs(args)
    if args.rounds:
        data["flags"] = flags_run(args.rounds)
    if args.task_rounds:
        levels = [int(n) for n in args.host_tasks.split(",")]
        data["host_tasks"] = host_tasks_run(levels, args.task_rounds, args.before_src)
    data["load_end"] = load()
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
