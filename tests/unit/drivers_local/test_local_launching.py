"""How the launcher turns an instance into a command line."""

from __future__ import annotations

import sys
from pathlib import Path

from warmshell.core.config import StatePaths
from warmshell.core.ids import InstanceId
from warmshell.drivers.local.instances import Instance
from warmshell.drivers.local.launching import PACKAGE_ROOT, Launcher


def instance(tmp_path: Path) -> Instance:
    return Instance(
        instance_id=InstanceId("li-1"),
        workspace="default",
        hostname="demo",
        directory=tmp_path / "sandboxes" / "li-1",
        created_us=1,
    )


def command_of(argv: list[str]) -> list[str]:
    return argv[argv.index("--") + 1 :]


def setenv(argv: list[str]) -> dict[str, str]:
    options = argv[: argv.index("--")]
    return {options[i + 1]: options[i + 2] for i, a in enumerate(options) if a == "--setenv"}


def image_dir(tmp_path: Path) -> Path:
    image = tmp_path / "image"
    (image / "usr").mkdir(parents=True)
    (image / "etc").mkdir()
    return image


def test_host_root_runs_the_gateway_interpreter(tmp_path: Path) -> None:
    launcher = Launcher(bwrap="bwrap", paths=StatePaths(tmp_path / "state"), python=sys.executable)
    launcher.prepare("")
    launch = launcher.build(instance(tmp_path), image="", fd=5, info_fd=6)
    assert launch.reports_child
    assert command_of(list(launch.argv)) == [sys.executable, "-m", "warmshell", "supervisor"]
    assert setenv(list(launch.argv))["PYTHONPATH"] == str(PACKAGE_ROOT)
    options = list(launch.argv[: launch.argv.index("--")])
    masked = [options[i + 1] for i, a in enumerate(options) if a == "--tmpfs"]
    assert str((tmp_path / "state").resolve()) in masked, "the state directory is hidden"


def test_image_root_binds_the_interpreter_and_the_package(tmp_path: Path) -> None:
    launcher = Launcher(bwrap="bwrap", paths=StatePaths(tmp_path / "state"), python=sys.executable)
    image = image_dir(tmp_path)
    launcher.prepare(str(image))
    argv = list(launcher.build(instance(tmp_path), image=str(image), fd=5, info_fd=6).argv)
    program = command_of(argv)[0]
    assert program.startswith("/run/warmshell/python/")
    assert Path(program).name == Path(sys.executable).resolve().name
    assert setenv(argv)["PYTHONPATH"].split(":")[0] == "/run/warmshell/src"
    options = argv[: argv.index("--")]
    binds = [tuple(options[i + 1 : i + 3]) for i, a in enumerate(options) if a == "--ro-bind"]
    assert (str(PACKAGE_ROOT), "/run/warmshell/src") in binds
    assert (str(image / "usr"), "/usr") in binds


def test_image_root_with_an_interpreter_inside_the_image(tmp_path: Path) -> None:
    launcher = Launcher(
        bwrap="bwrap",
        paths=StatePaths(tmp_path / "state"),
        python="/usr/bin/python3",
        python_in_image="/usr/bin/python3",
    )
    image = image_dir(tmp_path)
    launcher.prepare(str(image))
    argv = list(launcher.build(instance(tmp_path), image=str(image), fd=5, info_fd=6).argv)
    assert command_of(argv) == ["/usr/bin/python3", "-m", "warmshell", "supervisor"]
    assert "/run/warmshell/python" not in argv


def test_unisolated_runs_a_plain_process(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / "state")
    launcher = Launcher(bwrap=None, paths=paths, python="/usr/bin/python3")
    launch = launcher.build(instance(tmp_path), image="", fd=5, info_fd=6)
    assert not launch.reports_child
    assert list(launch.argv) == ["/usr/bin/python3", "-m", "warmshell", "supervisor"]
    assert launch.cwd == tmp_path / "sandboxes" / "li-1" / "workspace"
    assert launch.env is not None
    assert launch.env["WARMSHELL_GATEWAY"] == f"unix://{paths.supervisor_socket}"
    assert launch.env["WARMSHELL_BOOTSTRAP_FD"] == "5"


def test_cgroup_prefix(tmp_path: Path) -> None:
    launcher = Launcher(bwrap=None, paths=StatePaths(tmp_path), python="/usr/bin/python3")
    member = instance(tmp_path)
    member.cgroup = tmp_path / "cg"
    argv = list(launcher.build(member, image="", fd=5, info_fd=6).argv)
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[4] == str(tmp_path / "cg" / "cgroup.procs")
    assert argv[5:] == ["/usr/bin/python3", "-m", "warmshell", "supervisor"]
