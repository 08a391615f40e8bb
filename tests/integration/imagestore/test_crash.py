"""A process killed (SIGKILL) in the middle of an import leaves a store the next open makes
consistent: no image, no layer, no staging left, and a later import of the same image works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import images
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore

ROOT = Path(__file__).resolve().parents[3]
_CHILD = """
import sys
from pathlib import Path
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore
store = ImageStore(Path(sys.argv[1]), max_bytes=1 << 32)
store.open()
import_image(store, Path(sys.argv[2]), name="crash:1")
"""


def test_a_kill_mid_import_leaves_a_consistent_store(tmp_path: Path) -> None:
    layers = images.slow_layers(3, files=400, file_bytes=16 << 10)
    images.write_oci_layout(tmp_path / "layout", layers)
    root = tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root), str(tmp_path / "layout")], cwd=ROOT, env={**os.environ}
    )
    try:
        deadline = time.monotonic() + 30
        # Killed once the second layer is being unpacked: one layer complete in staging.
        while time.monotonic() < deadline and child.poll() is None:
            staged = list((root / "staging").glob("import-*/*")) if (root / "staging").exists() else []
            if len(staged) >= 2:
                break
            time.sleep(0.005)
        assert child.poll() is None, "the import ended before it could be interrupted"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert list((root / "staging").iterdir())  # what the kill left
    store = ImageStore(root, max_bytes=1 << 32)
    store.open()
    index = store.index()
    assert (index.images, index.layers) == ({}, {})
    assert list((root / "staging").iterdir()) == []
    assert list((root / "layers" / "sha256").iterdir()) == []
    image, _ = import_image(store, tmp_path / "layout", name="crash:1")
    assert len(store.index().layers) == len(layers) == len(image.layers)
