"""The fork server runs a container's ``-m MODULE`` from the code it found once, as ``runpy`` would
have run it: the same globals and ``sys.argv[0]``, for a package's ``__main__`` and a module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubesim.kubelet import forkserver

_MAIN = """
import json, sys
print(json.dumps({
    "name": __name__, "package": __package__, "spec": __spec__.name, "file": __file__,
    "argv0": sys.argv[0], "main": sys.modules["__main__"].__dict__ is globals(),
}))
"""

_RUN = """
import runpy, sys
from kubesim.kubelet import forkserver
module, how = sys.argv[1], sys.argv[2]
sys.argv = ["-m"]
if how == "runpy":
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    forkserver._run_main(*forkserver._main_code(module))
"""


@pytest.mark.parametrize("module", ["pkg", "pkg.tool"])
def test_a_module_runs_as_runpy_runs_it(tmp_path: Path, module: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text(_MAIN)
    (tmp_path / "pkg" / "tool.py").write_text(_MAIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    seen = [
        json.loads(
            subprocess.run([sys.executable, "-c", _RUN, module, how], env=env, capture_output=True, check=True).stdout
        )
        for how in ("runpy", "forkserver")
    ]
    assert seen[0] == seen[1]
    assert seen[0]["name"] == "__main__"
    assert seen[0]["main"]


def test_a_module_that_does_not_exist_is_an_import_error() -> None:
    with pytest.raises(ImportError, match="no_such_module"):
        forkserver._main_code("no_such_module_here")
