"""Turns an instance into a command line: bubblewrap when isolated, a plain process otherwise.

Unisolated mode (`local.allow_unisolated`, used only when bwrap is missing) runs the supervisor
and therefore every workload as an ordinary process of the gateway's user: it sees and can
change the whole host, including the gateway's state directory and API token, and shares its
network. It is for development machines without bubblewrap, never for untrusted workloads.

With an image root (see `images`) the image has neither our package nor, usually, our
interpreter: the directory holding `warmshell` is bound read-only at /run/warmshell/src (on
PYTHONPATH), and unless `local.python` names an interpreter inside the image (with warmshell's
dependencies installed), the gateway's own interpreter prefix is bound at /run/warmshell/python
and the supervisor runs from there. That works for interpreters that do not find libpython
through an absolute RPATH (Debian's /usr/bin/python3 does; a pyenv `--enable-shared` build does
not) and whose C library the image's is compatible with.
"""

from __future__ import annotations

import site
import sys
from collections.abc import Sequence
from pathlib import Path

from warmshell.core.config import StatePaths
from warmshell.drivers.local import cgroups, sandboxing
from warmshell.drivers.local.instances import Instance
from warmshell.drivers.local.processes import Launch

__all__ = ["PACKAGE_ROOT", "Launcher"]

# The directory holding the `warmshell` package (src/ in a checkout): PYTHONPATH in sandboxes.
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
_HOST_ROOT = Path("/")
_IMAGE_PYTHON = "/run/warmshell/python"
_IMAGE_SRC = "/run/warmshell/src"


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


class Launcher:
    """Builds each supervisor's `Launch`; caches root listings (top-level dirs rarely change)."""

    def __init__(
        self,
        *,
        bwrap: str | None,
        paths: StatePaths,
        python: str,
        python_in_image: str = "",
        command: Sequence[str] | None = None,
    ) -> None:
        """`python` runs the supervisor; `python_in_image`, when set, is the interpreter to use
        inside image roots instead of a bound copy of `python`; `command` replaces
        `<python> -m warmshell supervisor` altogether (tests use stand-ins)."""
        self.bwrap = bwrap
        self._paths = paths
        self._python = Path(python)
        self._python_in_image = python_in_image
        self._command = list(command) if command is not None else None
        self._roots: dict[Path, list[sandboxing.RootEntry]] = {}
        self._image: tuple[list[tuple[Path, str]], Path, list[str]] | None = None

    @property
    def isolated(self) -> bool:
        """Whether supervisors run under bubblewrap."""
        return self.bwrap is not None

    def prepare(self, image: str) -> None:
        """Blocking: list the root filesystem once per image (call through a thread)."""
        root = Path(image) if image else _HOST_ROOT
        if root not in self._roots:
            self._roots[root] = sandboxing.list_root(root)
        if image and self._image is None:
            self._image = self._image_binds()

    def build(self, instance: Instance, *, image: str, fd: int, info_fd: int) -> Launch:
        """The command line for `instance`, reading its credential from `fd`; bwrap reports
        the sandbox's pid on `info_fd`."""
        if self.bwrap is None:
            env = sandboxing.supervisor_environment(
                instance_id=instance.instance_id,
                bootstrap_fd=fd,
                gateway_url=f"unix://{self._paths.supervisor_socket}",
                home=str(instance.workspace_dir),
                pythonpath=str(PACKAGE_ROOT),
            )
            argv = self._in_cgroup(instance, self._supervisor(self._python))
            return Launch(argv, env=env, cwd=instance.workspace_dir)
        root = Path(image) if image else _HOST_ROOT
        binds, python, pythonpath = (
            self._image if image and self._image else ([(p, str(p)) for p in self._shadowed_needs()], self._python, [])
        )
        env = sandboxing.supervisor_environment(
            instance_id=instance.instance_id,
            bootstrap_fd=fd,
            gateway_url=f"unix://{sandboxing.GATEWAY_SOCKET}",
            home=sandboxing.WORKSPACE,
            pythonpath=":".join(pythonpath) if image else str(PACKAGE_ROOT),
        )
        layout = sandboxing.SandboxLayout(
            bwrap=self.bwrap,
            root=root,
            entries=self._roots[root],
            workspace_dir=instance.workspace_dir,
            supervisor_socket=self._paths.supervisor_socket,
            hostname=instance.hostname,
            environment=env,
            command=self._supervisor(python),
            hidden=self._hidden(),
            extra_ro_binds=binds,
            info_fd=info_fd,
        )
        argv = self._in_cgroup(instance, sandboxing.bwrap_argv(layout))
        return Launch(argv, reports_child=True)

    def _supervisor(self, python: Path) -> list[str]:
        if self._command is not None:
            return self._command
        return [str(python), "-m", "warmshell", "supervisor"]

    def _image_binds(self) -> tuple[list[tuple[Path, str]], Path, list[str]]:
        """Binds, interpreter path and PYTHONPATH for a sandbox whose root is an image
        (blocking: resolves paths)."""
        if self._python_in_image:
            return [(PACKAGE_ROOT, _IMAGE_SRC)], Path(self._python_in_image), [_IMAGE_SRC]
        real = self._python.resolve()
        prefix = Path(sys.base_prefix).resolve()
        if not _inside(real, prefix):
            prefix = real.parent.parent
        binds = [(prefix, _IMAGE_PYTHON), (PACKAGE_ROOT, _IMAGE_SRC)]
        pythonpath = [_IMAGE_SRC]
        if sys.prefix != sys.base_prefix:  # a virtualenv: its site-packages live elsewhere
            existing = [d for d in site.getsitepackages() if Path(d).is_dir()]
            for index, directory in enumerate(existing):
                target = f"/run/warmshell/site{index}"
                binds.append((Path(directory), target))
                pythonpath.append(target)
        python = Path(_IMAGE_PYTHON) / real.relative_to(prefix)
        return binds, python, pythonpath

    @staticmethod
    def _in_cgroup(instance: Instance, argv: list[str]) -> list[str]:
        if instance.cgroup is None:
            return argv
        return [*cgroups.enter_argv(instance.cgroup), *argv]

    def _shadowed_needs(self) -> list[Path]:
        # The interpreter or the package may live where the sandbox mounts its own filesystems
        # (a checkout or a virtualenv under /tmp): bind those back read-only.
        prefixes = {Path(sys.base_prefix), Path(sys.prefix), self._python.resolve().parent.parent, PACKAGE_ROOT}
        return sorted(p for p in prefixes if sandboxing.shadowed(p))

    def _hidden(self) -> list[Path]:
        # The state directory holds the API token, the signing key and every instance record;
        # mask it unless that would also hide the interpreter or the package.
        state = self._paths.root.resolve()
        needed = (self._python.resolve(), PACKAGE_ROOT)
        if any(_inside(path, state) for path in needed):
            return []
        return [state]
