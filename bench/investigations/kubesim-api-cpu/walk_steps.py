"""How much of each write kubesim's validation walks: `claim_cpu_inprocess.py`'s workload (the
pool's fill, then CLAIMS warm claims) with a counter on both walks (a custom resource's schema,
`Schema._walk`; a built-in kind's pruning, `builtin_schemas._walk`), by resource, verb and whether
the stored version's admitter was known (ratcheting needs it). The counts do not depend on the
host's load, so trees compare without alternation:

    PYTHONPATH=<tree>/src:bench python bench/investigations/kubesim-api-cpu/walk_steps.py [CLAIMS]
"""

from __future__ import annotations

import asyncio
import collections
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import claim_cpu_inprocess

from kubesim.apiserver import builtin_schemas, rest, schema

Key = tuple[str, str, str]


def count_walks() -> tuple[collections.Counter[Key], collections.Counter[Key]]:
    """Patch the walks and the validation entry; (writes, walk steps) by key, filled as it runs."""
    writes: collections.Counter[Key] = collections.Counter()
    steps: collections.Counter[Key] = collections.Counter()
    current: list[Key] = []
    pruning_walk, schema_walk, validate = builtin_schemas._walk, schema.Schema._walk, rest.Rest._validate

    def counted_pruning(*args: Any, **kwargs: Any) -> None:
        steps[current[-1]] += 1
        pruning_walk(*args, **kwargs)

    def counted_schema(self: schema.Schema, *args: Any, **kwargs: Any) -> None:
        steps[current[-1]] += 1
        schema_walk(self, *args, **kwargs)

    def counted_validate(self: rest.Rest, rt: Any, version: str, new: Any, old: Any, opts: Any) -> Any:
        known = "admitter known" if old is not None and old.admitted_by is not None else "-"
        key = (rt.plural, "update" if old is not None else "create", known)
        writes[key] += 1
        current.append(key)
        try:
            return validate(self, rt, version, new, old, opts)
        finally:
            current.pop()

    builtin_schemas._walk = counted_pruning  # type: ignore[assignment]
    schema.Schema._walk = counted_schema  # type: ignore[method-assign]
    rest.Rest._validate = counted_validate  # type: ignore[method-assign]
    return writes, steps


def main() -> None:
    claims = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    writes, steps = count_walks()
    asyncio.run(claim_cpu_inprocess.main(claims))
    print(f"{sum(writes.values())} validated writes, {sum(steps.values())} walk steps")
    for key, n in sorted(writes.items(), key=lambda kv: -steps[kv[0]]):
        print(f"  {' '.join(key)}: {n} writes, {steps[key]} steps, {steps[key] / n:.0f} per write")


if __name__ == "__main__":
    main()
