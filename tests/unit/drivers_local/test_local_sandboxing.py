"""The bubblewrap argv and the root plans, flag by flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.drivers.local.runtime import sandboxing
from warmshell.drivers.local.runtime.sandboxing import RootEntry, RootPlan, SandboxLayout

HOST_ENTRIES = [
    RootEntry("bin", "usr/bin"),
    RootEntry("boot"),
    RootEntry("dev"),
    RootEntry("etc"),
    RootEntry("home"),
    RootEntry("lib", "usr/lib"),
    RootEntry("lib64", "usr/lib64"),
    RootEntry("media"),
    RootEntry("mnt"),
    RootEntry("opt"),
    RootEntry("proc"),
    RootEntry("root"),
    RootEntry("run"),
    RootEntry("sbin", "usr/sbin"),
    RootEntry("srv"),
    RootEntry("sys"),
    RootEntry("tmp"),
    RootEntry("usr"),
    RootEntry("var"),
]
HOST_ETC = ["passwd", "group", "shadow", "gshadow", "sudoers", "ssh", "machine-id", "hosts", "pip.conf", "ssl"]


def layout(**overrides: object) -> SandboxLayout:
    fields: dict[str, object] = {
        "bwrap": "/usr/bin/bwrap",
        "plan": sandboxing.host_root_plan(HOST_ENTRIES, HOST_ETC),
        "workspace_dir": Path("/srv/ws/li-1"),
        "agent": Path("/srv/ws/warmshell-agent-0123"),
        "control_fd": 7,
        "seccomp_fd": 8,
        "info_fd": 9,
        "hostname": "demo",
        "instance_id": "li-1",
    }
    fields.update(overrides)
    return SandboxLayout(**fields)  # type: ignore[arg-type]


def options(argv: list[str]) -> list[str]:
    return argv[: argv.index("--")]


def pairs(argv: list[str], flag: str, arity: int) -> list[tuple[str, ...]]:
    """Every occurrence of `flag` with its arguments (only before the `--`)."""
    before = options(argv)
    return [tuple(before[i + 1 : i + 1 + arity]) for i, a in enumerate(before) if a == flag]


def test_namespaces_capabilities_seccomp_and_lifetime() -> None:
    argv = sandboxing.bwrap_argv(layout())
    assert argv[0] == "/usr/bin/bwrap"
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--clearenv",
    ):
        assert flag in options(argv), flag
    assert pairs(argv, "--cap-drop", 1) == [("ALL",)]
    assert pairs(argv, "--seccomp", 1) == [("8",)]
    assert pairs(argv, "--info-fd", 1) == [("9",)]
    assert pairs(argv, "--uid", 1) == [("0",)]


def test_the_agent_is_pid_1_with_its_control_fd() -> None:
    argv = sandboxing.bwrap_argv(layout())
    assert argv[argv.index("--") + 1 :] == [sandboxing.AGENT_PATH, "7"]
    assert (str(Path("/srv/ws/warmshell-agent-0123")), sandboxing.AGENT_PATH) in pairs(argv, "--ro-bind", 2)


def test_host_root_is_an_allow_list() -> None:
    argv = sandboxing.bwrap_argv(layout())
    bound = {target for _, target in pairs(argv, "--ro-bind", 2)}
    linked = {target for _, target in pairs(argv, "--symlink", 2)}
    assert {"/usr"} <= bound
    assert linked == {"/bin", "/lib", "/lib64", "/sbin"}
    for hidden in ("/root", "/home", "/var", "/srv", "/opt", "/mnt", "/media", "/sys", "/boot", "/etc"):
        assert hidden not in bound, hidden
    etc = sorted(t for t in bound if t.startswith("/etc/"))
    assert etc == ["/etc/group", "/etc/hosts", "/etc/passwd", "/etc/ssl"]
    assert pairs(argv, "--dir", 1) == [("/etc",)]


def test_a_staged_etc_is_one_bind_plus_the_allowed_directories() -> None:
    plan = sandboxing.host_root_plan(
        HOST_ENTRIES, HOST_ETC, staged_etc=Path("/state/sandbox-etc"), etc_dirs=("ssl", "ssh")
    )
    argv = sandboxing.bwrap_argv(layout(plan=plan))
    etc = [(s, t) for s, t in pairs(argv, "--ro-bind", 2) if t.startswith("/etc")]
    # The copy first (the directory binds go on top of it), then only allowed directories.
    assert etc == [("/state/sandbox-etc", "/etc"), ("/etc/ssl", "/etc/ssl")]
    assert pairs(argv, "--dir", 1) == []


def test_fresh_proc_dev_tmp_run_and_writable_workspace_only() -> None:
    argv = sandboxing.bwrap_argv(layout())
    assert pairs(argv, "--tmpfs", 1) == [("/tmp",), ("/run",), ("/dev/shm",)]
    assert pairs(argv, "--remount-ro", 1) == [("/dev",), ("/",)]
    assert pairs(argv, "--dev", 1) == [("/dev",)]
    assert pairs(argv, "--proc", 1) == [("/proc",)]
    assert pairs(argv, "--bind", 2) == [("/srv/ws/li-1", "/workspace")]
    assert pairs(argv, "--chdir", 1) == [("/workspace",)]


def test_nothing_of_a_gateway_is_named() -> None:
    text = " ".join(sandboxing.bwrap_argv(layout()))
    for secret in ("sock", "token", "signing", "credential", "BOOTSTRAP", "GATEWAY"):
        assert secret not in text, secret


def test_extra_binds_come_after_tmp_and_run() -> None:
    argv = sandboxing.bwrap_argv(layout(extra_ro_binds=[Path("/opt/tools"), Path("/run/extra")]))
    before = options(argv)
    assert ("/opt/tools", "/opt/tools") in pairs(argv, "--ro-bind", 2)
    assert before.index("/run/extra") > before.index("/run")


def test_environment_is_only_path_and_the_instance_id() -> None:
    argv = sandboxing.bwrap_argv(layout())
    assert pairs(argv, "--setenv", 2) == [("PATH", "/usr/local/bin:/usr/bin:/bin"), ("WARMSHELL_INSTANCE_ID", "li-1")]


def test_image_root_binds_every_entry_but_the_replaced_ones() -> None:
    entries = [RootEntry("bin", "usr/bin"), RootEntry("etc"), RootEntry("proc"), RootEntry("usr"), RootEntry("var")]
    plan = sandboxing.image_root_plan(Path("/images/deb"), entries)
    assert plan == RootPlan(
        binds=(
            (Path("/images/deb/usr"), "/usr"),
            (Path("/images/deb/var"), "/var"),
            (Path("/images/deb/etc"), "/etc"),
        ),
        symlinks=(("usr/bin", "/bin"),),
    )


def test_list_root_reads_directories_and_symlinks(tmp_path: Path) -> None:
    (tmp_path / "usr").mkdir()
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "file").write_text("x")
    assert sandboxing.list_root(tmp_path) == [RootEntry("bin", "usr/bin"), RootEntry("usr")]


def test_tmpfs_sizes_come_right_before_their_mounts() -> None:
    import dataclasses

    argv = sandboxing.bwrap_argv(dataclasses.replace(layout(), tmp_bytes=1, run_bytes=2, shm_bytes=3))
    sized = [(argv[i + 1], argv[i + 3]) for i, arg in enumerate(argv) if arg == "--size"]
    assert sized == [("1", "/tmp"), ("2", "/run"), ("3", "/dev/shm")]
    assert all(argv[i + 2] == "--tmpfs" for i, arg in enumerate(argv) if arg == "--size")


def test_an_image_of_the_store_is_its_overlay_bound_writable_as_root_under_the_rest() -> None:
    argv = sandboxing.bwrap_argv(layout(plan=RootPlan(()), overlay_root=Path("/var/lib/ws/rootfs/m"), uid=1234, gid=55))
    before = options(argv)
    assert pairs(argv, "--bind", 2)[0] == ("/var/lib/ws/rootfs/m", "/")
    assert before.index("--bind") < before.index("--dev") < before.index("--ro-bind")  # first, the rest on top
    assert ("/",) not in pairs(argv, "--remount-ro", 1)  # the sandbox writes into its upper layer
    assert ("/dev",) in pairs(argv, "--remount-ro", 1)
    assert (pairs(argv, "--uid", 1), pairs(argv, "--gid", 1)) == ([("1234",)], [("55",)])
    assert ("/srv/ws/warmshell-agent-0123", sandboxing.AGENT_PATH) in pairs(argv, "--ro-bind", 2)
    # Without an overlay the root stays read-only, and the gid is the uid.
    plain = sandboxing.bwrap_argv(layout(uid=7))
    assert ("/",) in pairs(plain, "--remount-ro", 1)
    assert pairs(plain, "--gid", 1) == [("7",)]


def test_an_image_holding_its_workspace_keeps_it_under_the_overlay_and_mounts_nothing_there() -> None:
    kept = sandboxing.bwrap_argv(layout(overlay_root=Path("/r/m"), workspace_in_root=True, workspace_bytes=1 << 20))
    assert (sandboxing.WORKSPACE,) not in pairs(kept, "--tmpfs", 1)
    assert all(target != sandboxing.WORKSPACE for _, target in pairs(kept, "--bind", 2))
    assert kept[kept.index("--chdir") + 1] == sandboxing.WORKSPACE
    # Without an overlay root the flag means nothing: /workspace is mounted as ever.
    host = sandboxing.bwrap_argv(layout(workspace_in_root=True, workspace_bytes=1 << 20))
    assert (sandboxing.WORKSPACE,) in pairs(host, "--tmpfs", 1)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"workspace_bytes": 1 << 20},
        {"extra_ro_binds": [Path("/opt/tools")], "egress_dir": Path("/run/ws/egress/li-1")},
        {"overlay_root": Path("/srv/rootfs/m"), "plan": RootPlan(()), "workspace_in_root": True},
        {"overlay_root": Path("/srv/rootfs/m"), "plan": RootPlan(()), "workspace_bytes": 1 << 20},
        {"plan": sandboxing.host_root_plan(HOST_ENTRIES, HOST_ETC, staged_etc=Path("/srv/etc"), etc_dirs=["ssl"])},
    ],
)
def test_the_launcher_keeps_exactly_the_trees_bwrap_binds_and_what_it_reads(overrides: dict[str, object]) -> None:
    sandbox = layout(**overrides)
    argv = sandboxing.bwrap_argv(sandbox)
    sources = {source for flag in ("--bind", "--ro-bind") for source, _ in pairs(argv, flag, 2)}
    trees, reads = sandboxing.kept_mounts(sandbox)
    # /proc whole as well: a container's masks under it are what refuse a fresh proc mount.
    assert set(trees) == {*sources, "/proc"}
    assert len(trees) == len(sources) + 1
    assert {"/tmp", "/dev/null", "/dev/urandom", "/usr/bin/bwrap"} <= set(reads)
    assert not any(path.startswith(("/sys", "/home", "/var")) for path in (*trees, *reads))
