"""The setuptools hook that makes the sandbox agent and `warmshell-launch` package data: a wheel
built where a C compiler exists carries them, compiled from the C sources it also carries. Without
a compiler the wheel is built without them (with a warning), and the local driver names the
missing binary and how to build it when it starts. Everything else is in pyproject.toml."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

AGENT = ("warmshell", "drivers", "local", "runtime", "agent")


def _building() -> ModuleType:
    # By path: warmshell is not importable while its own wheel is being built.
    path = Path(__file__).resolve().parent.joinpath("src", *AGENT, "building.py")
    spec = importlib.util.spec_from_file_location("_warmshell_agent_building", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithAgent(build_py):
    """build_py, then the agent binaries compiled into the build tree."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install runs the ones built in place (scripts/build-agent)
            return
        building = _building()
        if building.compiler() is None:
            self.warn(f"no C compiler: the wheel has no sandbox agent; build it after installing with {building.HOW}")
            return
        for path in building.build(Path(self.build_lib).joinpath(*AGENT)):
            self.announce(f"built {path}", level=2)


setup(cmdclass={"build_py": BuildPyWithAgent})
