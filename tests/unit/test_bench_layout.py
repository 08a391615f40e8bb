"""The benchmarks area keeps its shape: one current result per standing benchmark, named after it,
and both READMEs list exactly the standing benchmarks, each once."""

from __future__ import annotations

import collections
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def standing() -> set[str]:
    """The benchmarks with a current result: `bench/results/<name>.{json,md}`."""
    return {path.stem for path in (BENCH / "results").iterdir()}


def listed(readme: Path, heading: str, column: int) -> collections.Counter[str]:
    """The scripts named in one column of the table under `heading` (the first column is 0)."""
    section = readme.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    cells = [line.strip("|").split("|")[column] for line in section.splitlines() if line.startswith("| ")]
    return collections.Counter(name for cell in cells for name in re.findall(r"`(\w+)\.py`", cell))


def test_each_current_result_is_a_json_and_a_markdown_named_after_a_script() -> None:
    results = sorted(path.name for path in (BENCH / "results").iterdir())
    for name in standing():
        assert (BENCH / f"{name}.py").is_file(), f"bench/results/{name}.* has no bench/{name}.py"
        assert f"{name}.json" in results, f"bench/results/{name}.md has no .json beside it"
        assert f"{name}.md" in results, f"bench/results/{name}.json has no .md beside it"
    assert all(name.endswith((".json", ".md")) for name in results), results


def test_the_bench_readme_lists_every_standing_benchmark_once() -> None:
    names = listed(BENCH / "README.md", "## Today's figures", column=0)
    assert set(names) == standing()
    assert max(names.values()) == 1, names


def test_the_top_level_readme_lists_every_standing_benchmark_once() -> None:
    names = listed(ROOT / "README.md", "## Benchmarks", column=1)
    assert set(names) == standing()
    assert max(names.values()) == 1, names


def test_every_investigation_says_what_was_asked_and_found() -> None:
    topics = [path for path in (BENCH / "investigations").iterdir() if path.is_dir()]
    assert topics
    for topic in topics:
        text = (topic / "README.md").read_text()
        assert "**Asked.**" in text, topic.name
        assert "**Found" in text, topic.name
