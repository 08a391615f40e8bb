"""What a sandbox record's encode and decode cost, unprofiled (thread CPU per call): the encode
as the store writes it (with the wrap serializers that leave later-added keys out until set:
`_without_unset_keys`), the same record type built without them, a decode of the stored JSON, and a deep copy.

    python bench/investigations/start-path/record_codec.py [--calls 5000]

Results in `results/<name>.{json,md}`.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness
from harness import write_results

from warmshell.core import models
from warmshell.core.ids import SandboxId
from warmshell.core.models import Condition, SandboxRecord, SandboxSpec


def record() -> SandboxRecord:
    """A warm create's record as it is written: a spec with environment and command, two conditions."""
    made = SandboxRecord(
        id=SandboxId("sb-0123456789abcdef"),
        name="seq-1",
        labels={"team": "a"},
        spec=SandboxSpec(environment={"POOL": "seq"}, command=["sleep", "infinity"]),
        activation_proof_hash="0" * 64,
    )
    made.status.set_condition(Condition(type="Ready", reason="SessionOpen", message="supervisor connected"))
    made.status.set_condition(Condition(type="Network", status="False", reason="NoEgress", message="loopback only"))
    return made


def without_wrap_serializers() -> type[SandboxRecord]:
    """`SandboxRecord` from the same source with every `@model_serializer` line taken out (the
    ones that leave a later-added key out until it is set)."""
    source = Path(models.__file__).read_text()
    marked = '    @model_serializer(mode="wrap")\n'
    assert marked in source, "the wrap serializers moved: update this benchmark"
    module = types.ModuleType("models_without_wrap")
    sys.modules[module.__name__] = module  # pydantic resolves the annotations through it
    exec(compile(source.replace(marked, ""), module.__name__, "exec"), module.__dict__)
    plain: type[SandboxRecord] = module.SandboxRecord
    return plain


def per_call_us(call: Callable[[], object], calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        call()
    return (time.thread_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000, help="calls per figure (default 5000)")
    parser.add_argument("--name", default="record_codec", help="results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    wrapped = record()
    stored = wrapped.model_dump_json(exclude={"resource_version"})
    plain = without_wrap_serializers().model_validate_json(stored)
    figures = {
        "encode (as stored)": per_call_us(lambda: wrapped.model_dump_json(exclude={"resource_version"}), args.calls),
        "encode without the wrap serializers": per_call_us(
            lambda: plain.model_dump_json(exclude={"resource_version"}), args.calls
        ),
        "decode": per_call_us(lambda: SandboxRecord.model_validate_json(stored), args.calls),
        "deep copy": per_call_us(lambda: wrapped.model_copy(deep=True), args.calls),
    }
    table = "| µs of CPU per call | |\n|---|---|\n" + "".join(f"| {k} | {v:.1f} |\n" for k, v in figures.items())
    write_results(args.name, {"calls": args.calls, "us_per_call": figures, "bytes": len(stored)}, table)


if __name__ == "__main__":
    main()
