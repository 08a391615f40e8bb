"""Copies of a `src/` tree with the member start's later features switched off, one variant per
feature and one with all of them, for `burst_ab.py` to compare with the tree before the redesign
(74935cd): what is left between "before" and "none" is the redesign's own cost.

    python bench/investigations/start-path/feature_variants.py --src src --out /tmp/variants
    python bench/investigations/start-path/burst_ab.py --tree before=/tmp/before-tree/src \\
        --tree after=src --tree none=/tmp/variants/none/src --rounds 2

No config switches these off, so each variant is the tree with a few lines replaced (each
replacement must match exactly once, or the script stops: a tree that moved on needs this file
updated, never a silently unpatched copy). The agent and launcher binaries are copied with the
tree (build them first). What each variant removes:

- `nocgroup`: the cgroup v1 group per sandbox (five hierarchies made, limits written, the
  launcher's `cgroup.procs` writes, the removal at stop), as 74935cd on this host (v2 only);
- `noegress`: the egress directory per sandbox (its mkdir and chown, its bind) and with it the
  CA bundle's placement; the agent gets no egress port;
- `nobundle`: only the CA bundle's placement (the egress directory kept): up to 0a073ec its copy
  per start and the copy's bind; since, the staged bundle's link and each start's link to it;
- `nolease`: the uid lease file (a file written, linked and unlinked per start, one unlinked
  per stop) replaced by a set in memory, as 74935cd's `UidRange`;
- `none`: all of the above;
- `nocpuquota`: not a feature: the cgroup kept without its CPU quota (a probe of where a
  member's wake-up waits);
- `cpuweight`: not a feature: the sandboxes' top cgroup `warmshell-weight/` with cpu.shares 8192
  (another probe of the same).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

# (file under src/warmshell, exact text, replacement)
Patch = tuple[str, str, str]
# Where trees differ: one of these patches, exactly one of which must apply.
Choice = tuple[Patch, ...]

_CGROUP: tuple[Patch | Choice, ...] = (
    (
        "drivers/local/hostsetup.py",
        "cgroup = cgroup if cgroup is not None else cgroupsetup.choose(gateway=gateway)",
        'cgroup = cgroups.Unavailable("switched off (a variant tree)")',
    ),
)
_BUNDLE: tuple[Patch | Choice, ...] = (
    (
        # 0a073ec and before: each start copied the bundle and bound the copy.
        (
            "drivers/local/runtime/launching.py",
            "system_bundle=_system_bundle_copy(plan, instance.egress_dir),",
            "system_bundle=None,",
        ),
        # Since: the staged bundle a link, each start one more (no link staged: none made).
        (
            "drivers/local/runtime/etcstage.py",
            "linked = name == _BUNDLE.parts[0] and _link_bundle(partial)",
            "linked = False",
        ),
    ),
)
_EGRESS: tuple[Patch | Choice, ...] = (
    *_BUNDLE,
    ("drivers/local/runtime/launching.py", "egress_dir=instance.egress_dir,", "egress_dir=None,"),
    (
        "drivers/local/fleet.py",
        "            instance.egress_dir.mkdir(mode=0o700)\n"
        "            if instance.uid is not None:\n"
        "                os.chown(instance.egress_dir, instance.uid, instance.uid)\n",
        "",
    ),
)
_LEASE: tuple[Patch | Choice, ...] = (
    (
        "drivers/local/runtime/uidlease.py",
        "    def _lease_new(self, uid: int) -> bool:\n",
        "    def _lease_new(self, uid: int) -> bool:\n"
        "        taken = self.__dict__.setdefault('_taken', set())\n"
        "        if uid in taken:\n"
        "            return False\n"
        "        taken.add(uid)\n"
        "        return True\n\n"
        "    def _lease_file(self, uid: int) -> bool:\n",
    ),
    (
        "drivers/local/runtime/uidlease.py",
        "        lease = self._leases / str(uid)\n",
        "        self.__dict__.setdefault('_taken', set()).discard(uid)\n        return\n"
        "        lease = self._leases / str(uid)\n",
    ),
)

# Not a feature: the cgroup kept, without its CPU quota (CFS bandwidth control), to tell the
# quota's part of a member's wake-up from the group's.
_CPU_QUOTA: tuple[Patch | Choice, ...] = (
    (
        "drivers/local/runtime/cgroups_v1.py",
        'if limits.cpu_millis is not None and "cpu" in controllers:',
        'if False and limits.cpu_millis is not None and "cpu" in controllers:',
    ),
)

# Not a feature either: every sandbox under a top group of eight times the default cpu weight
# (`warmshell-weight/`, cpu.shares 8192) rather than `warmshell/` (1024): whether a member's
# wake-up waits for the weight the host's sandboxes share.
_CPU_WEIGHT: tuple[Patch | Choice, ...] = (
    (
        "drivers/local/runtime/cgroups_v1.py",
        '        parent = directory / "warmshell" / gateway\n',
        '        parent = directory / "warmshell-weight" / gateway\n'
        "        with contextlib.suppress(OSError):\n"
        "            cgroups.make_parent(parent)\n"
        '            (directory / "warmshell-weight" / "cpu.shares").write_text("8192\\n")\n',
    ),
)

VARIANTS: dict[str, tuple[Patch | Choice, ...]] = {
    "nocgroup": _CGROUP,
    "nocpuquota": _CPU_QUOTA,
    "cpuweight": _CPU_WEIGHT,
    "noegress": _EGRESS,
    "nobundle": _BUNDLE,
    "nolease": _LEASE,
    "none": (*_CGROUP, *_EGRESS, *_LEASE),
}


def make(src: Path, out: Path, name: str) -> Path:
    """`out/NAME/src`: a copy of `src` with the variant's patches applied; its path."""
    target = out / name / "src"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    for step in VARIANTS[name]:
        choices: Choice = (step,) if isinstance(step[0], str) else step
        texts = {relative: (target / "warmshell" / relative).read_text() for relative, _, _ in choices}
        matching = [(relative, old, new) for relative, old, new in choices if texts[relative].count(old) == 1]
        if len(matching) != 1:
            raise SystemExit(f"{name}: expected exactly one of {[old for _, old, _ in choices]!r} once")
        relative, old, new = matching[0]
        (target / "warmshell" / relative).write_text(texts[relative].replace(old, new))
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, required=True, help="the tree's src/ (its agent built)")
    parser.add_argument("--out", type=Path, required=True, help="where the copies go (out/NAME/src)")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="default: every variant")
    args = parser.parse_args()
    for name in args.variant or VARIANTS:
        print(make(args.src.resolve(), args.out, name))


if __name__ == "__main__":
    main()
