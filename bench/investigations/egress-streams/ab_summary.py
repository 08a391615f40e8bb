"""Per-run figures of `bench/egress.py --before-src` results: the gateway's CPU per warm create
(p50) with nothing, a policy, and a policy and a bound secret; the ratios against nothing; a
bound secret over a policy alone; and the medians of the runs.

    python bench/investigations/egress-streams/ab_summary.py results/NAME.json ...
"""

from __future__ import annotations

import json
import statistics
import sys


def main() -> None:
    for path in sys.argv[1:]:
        with open(path) as handle:
            data = json.load(handle)
        print(path)
        for label in ("before", "after"):
            rows = []
            for run in data["runs"][label]:
                warm = run["warm_create"]
                nothing, policy, bound = (warm[k]["p50"] for k in ("plain_cpu_ms", "policy_cpu_ms", "secret_cpu_ms"))
                q1, _, q3 = statistics.quantiles(warm["secret_cpu_pair_ratios"], n=4)
                rows.append((nothing, policy, bound, warm["secret_cpu_ratio_p50"], warm["cpu_ratio_p50"]))
                print(
                    f"  {label}: nothing {nothing:.2f} policy {policy:.2f} bound {bound:.2f} ms; bound/nothing "
                    f"{warm['secret_cpu_ratio_p50']:.2f}x policy/nothing {warm['cpu_ratio_p50']:.2f}x; bound-policy "
                    f"{bound - policy:+.2f} ms; wall {warm['secret_ratio_p50']:.2f}x; pairs {q1:.2f}-{q3:.2f}"
                )
            print(
                f"  {label} median of runs: bound/nothing {statistics.median(r[3] for r in rows):.2f}x, "
                f"policy/nothing {statistics.median(r[4] for r in rows):.2f}x, "
                f"bound-policy {statistics.median(r[2] - r[1] for r in rows):+.2f} ms, "
                f"bound-nothing {statistics.median(r[2] - r[0] for r in rows):+.2f} ms"
            )


if __name__ == "__main__":
    main()
