"""The bubblewrap argv and the supervisor environment, flag by flag."""

from __future__ import annotations

from pathlib import Path

from warmshell.drivers.local import sandboxing
from warmshell.drivers.local.sandboxing import RootEntry, SandboxLayout


def layout(**overrides: object) -> SandboxLayout:
    fields: dict[str, object] = {
        "bwrap": "/usr/bin/bwrap",
        "root": Path("/"),
        "entries": [
            RootEntry("bin", "usr/bin"),
            RootEntry("dev"),
            RootEntry("etc"),
            RootEntry("proc"),
            RootEntry("run"),
            RootEntry("tmp"),
            RootEntry("usr"),
            RootEntry("workspace"),
        ],
        "workspace_dir": Path("/state/sandboxes/li-1/workspace"),
        "supervisor_socket": Path("/state/supervisor.sock"),
        "hostname": "demo",
        "environment": {"PATH": "/usr/bin", "HOME": "/workspace"},
        "command": ["/usr/bin/python3", "-m", "warmshell", "supervisor"],
    }
    fields.update(overrides)
    return SandboxLayout(**fields)  # type: ignore[arg-type]


def pairs(argv: list[str], flag: str, arity: int) -> list[tuple[str, ...]]:
    """Every occurrence of `flag` with its arguments (only before the `--`)."""
    options = argv[: argv.index("--")]
    return [tuple(options[i + 1 : i + 1 + arity]) for i, a in enumerate(options) if a == flag]


def test_namespaces_and_lifetime() -> None:
    argv = sandboxing.bwrap_argv(layout())
    assert argv[0] == "/usr/bin/bwrap"
    for flag in (
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ):
        assert flag in argv[: argv.index("--")], flag
    assert pairs(argv, "--cap-drop", 1) == [("ALL",)]


def test_root_entries_are_bound_read_only_except_replaced_ones() -> None:
    argv = sandboxing.bwrap_argv(layout())
    assert pairs(argv, "--ro-bind", 2) == [("/etc", "/etc"), ("/usr", "/usr")]
    assert pairs(argv, "--symlink", 2) == [("usr/bin", "/bin")]
    assert pairs(argv, "--tmpfs", 1) == [("/tmp",), ("/run",)]
    assert pairs(argv, "--dev", 1) == [("/dev",)]
    assert pairs(argv, "--proc", 1) == [("/proc",)]


def test_image_root_binds_from_the_image_and_adds_extra_binds() -> None:
    argv = sandboxing.bwrap_argv(
        layout(root=Path("/images/deb"), extra_ro_binds=[(Path("/opt/py"), "/run/warmshell/python")])
    )
    assert pairs(argv, "--ro-bind", 2) == [
        ("/images/deb/etc", "/etc"),
        ("/images/deb/usr", "/usr"),
        ("/opt/py", "/run/warmshell/python"),
    ]


def test_workspace_socket_and_read_only_root() -> None:
    argv = sandboxing.bwrap_argv(layout(hidden=[Path("/state")]))
    assert pairs(argv, "--bind", 2) == [
        ("/state/sandboxes/li-1/workspace", "/workspace"),
        ("/state/supervisor.sock", "/run/warmshell/gateway.sock"),
    ]
    assert ("/state",) in pairs(argv, "--tmpfs", 1)
    options = argv[: argv.index("--")]
    # The state dir is masked before the workspace (inside it) is bound, and / becomes
    # read-only only after every mount point was created.
    assert options.index("/state") < options.index("--bind")
    assert options.index("--remount-ro") > max(i for i, a in enumerate(options) if a == "--bind")
    assert pairs(argv, "--remount-ro", 1) == [("/",)]
    assert pairs(argv, "--hostname", 1) == [("demo",)]
    assert pairs(argv, "--chdir", 1) == [("/workspace",)]


def test_environment_and_command() -> None:
    argv = sandboxing.bwrap_argv(layout(info_fd=7))
    assert pairs(argv, "--setenv", 2) == [("PATH", "/usr/bin"), ("HOME", "/workspace")]
    assert pairs(argv, "--info-fd", 1) == [("7",)]
    assert argv[argv.index("--") + 1 :] == ["/usr/bin/python3", "-m", "warmshell", "supervisor"]


def test_supervisor_environment_is_exactly_the_contract() -> None:
    env = sandboxing.supervisor_environment(
        instance_id="li-1",
        bootstrap_fd=5,
        gateway_url="unix:///run/warmshell/gateway.sock",
        home="/workspace",
        pythonpath="/src",
    )
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/workspace",
        "WARMSHELL_GATEWAY": "unix:///run/warmshell/gateway.sock",
        "WARMSHELL_BOOTSTRAP_FD": "5",
        "WARMSHELL_INSTANCE_ID": "li-1",
        "PYTHONPATH": "/src",
    }
    assert "PYTHONPATH" not in sandboxing.supervisor_environment(
        instance_id="li-1", bootstrap_fd=5, gateway_url="x", home="/w"
    )


def test_list_root(tmp_path: Path) -> None:
    (tmp_path / "usr").mkdir()
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "file").write_text("ignored: not a directory")
    assert sandboxing.list_root(tmp_path) == [RootEntry("bin", "usr/bin"), RootEntry("usr")]
