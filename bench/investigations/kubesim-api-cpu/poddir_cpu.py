"""CPU of a pod directory's file work in the kubelet, per pod: making one shaped like a warm pool
member's (`claim_cpu.py`'s template: five volumes, the token, five mount symlinks, the hosts file,
two logs and two mount specs) and removing it with `shutil.rmtree` or `poddir_walk.remove` (a
walk of our own, measured, not adopted), alternating, process CPU (user + system), on /dev/shm as the kubelet uses.

    python bench/investigations/kubesim-api-cpu/poddir_cpu.py [--pods 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import poddir_walk as poddir  # beside this script


def _make(root: Path) -> Path:
    root.mkdir()
    (root / "hosts").write_text("127.0.0.1\tlocalhost\n" * 4)
    volumes = root / ".volumes"
    for v in range(5):
        (volumes / f"v{v}").mkdir(parents=True, exist_ok=True)
    (volumes / "v0" / "t").write_bytes(b"t" * 800)
    (root / "m").mkdir()
    for v in range(5):
        (root / "m" / str(v)).symlink_to(volumes / f"v{v}", target_is_directory=True)
    for private in (".logs", ".ns"):
        (root / private).mkdir()
    for container in ("supervisor", "agent"):
        (root / ".ns" / f"{container}.json").write_text("{}")
        (root / ".logs" / f"{container}.log").write_text("")
    return root


def _per_pod_ms(base: Path, pods: int, remove: object) -> tuple[float, float]:
    start = time.process_time()
    made = [_make(base / f"pod{i}") for i in range(pods)]
    making = time.process_time() - start
    start = time.process_time()
    for path in made:
        remove(path)  # type: ignore[operator]
    removing = time.process_time() - start
    assert not any(base.iterdir()), "a pod directory was left"
    return making / pods * 1e3, removing / pods * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ways = {"shutil.rmtree": lambda p: shutil.rmtree(p, ignore_errors=True), "poddir_walk.remove": poddir.remove}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        for round_ in range(args.rounds):
            for name, way in ways.items():
                make_ms, remove_ms = _per_pod_ms(Path(tmp), args.pods, way)
                print(f"round {round_} {name}: make {make_ms:.3f} ms/pod, remove {remove_ms:.3f} ms/pod")


if __name__ == "__main__":
    main()
