"""No function in `src/warmshell` is longer than 60 lines (the generated `api/` aside): a longer
one is split into named steps before it lands. Counted from the `def` line to the last line of
the body, decorators and the docstring included."""

from __future__ import annotations

import ast
from pathlib import Path

import warmshell

MAX_LINES = 60
SOURCE = Path(warmshell.__file__).parent
GENERATED = "api"  # the protobuf modules, under SOURCE


def function_lengths(source: str) -> dict[str, int]:
    """Each function's length in lines, by name (a nested or method name is its own name; when
    two share a name, the longer counts)."""
    lengths: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            lengths[node.name] = max(lengths.get(node.name, 0), node.end_lineno - first + 1)
    return lengths


def long_functions(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """`module path:function` -> length, for every function over `limit` lines under `root`."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(root / GENERATED):
            continue
        module = path.relative_to(root).as_posix()
        for name, length in function_lengths(path.read_text()).items():
            if length > limit:
                found[f"{module}:{name}"] = length
    return found


def test_no_function_is_longer_than_the_limit() -> None:
    over = long_functions(SOURCE)
    assert over == {}, f"functions longer than {MAX_LINES} lines (split them into named steps): {over}"


def test_the_count_includes_decorators_and_docstring() -> None:
    body = "\n".join(["@decorated", "async def f() -> None:", '    """Doc."""', *["    pass"] * 58])
    assert function_lengths(body) == {"f": 61}
    assert function_lengths(body.replace("@decorated\n", "")) == {"f": 60}


def test_a_long_function_is_found_but_generated_code_is_not(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def long():\n" + "    x = 1\n" * 61)
    (tmp_path / "pkg" / "short.py").write_text("def short():\n    return 1\n")
    (tmp_path / GENERATED).mkdir()
    (tmp_path / GENERATED / "generated.py").write_text("def long():\n" + "    x = 1\n" * 61)
    assert long_functions(tmp_path) == {"pkg/m.py:long": 62}
