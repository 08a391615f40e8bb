"""Any sequence of tar entries a hostile layer could hold — names with '..' and absolute paths,
links (symbolic and hard) to the outside and to each other, entries written through earlier
links, whiteouts, devices — imported for real: the import is refused (and leaves nothing) or
succeeds, and in neither case is anything outside the store created or changed."""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import images
from tests.helpers.images import Layer
from warmshell.core.errors import InvalidArgumentError, ResourceExhaustedError
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore

_NAMES = st.lists(st.sampled_from(["a", "b", "..", ".wh.a", ".wh..wh..opq", "OUT"]), min_size=1, max_size=4).map(
    "/".join
)
_LEADS = st.sampled_from(["", "/", "./"])


@st.composite
def _layer(draw: st.DrawFn, outside: str) -> Layer:
    layer = Layer()
    for _ in range(draw(st.integers(1, 8))):
        name = draw(_LEADS) + draw(_NAMES)
        kind = draw(st.sampled_from(["file", "dir", "symlink", "hardlink", "device"]))
        if kind == "file":
            layer.file(name, b"planted", mode=draw(st.sampled_from([0o644, 0o4755, 0o2755])))
        elif kind == "dir":
            layer.directory(name)
        elif kind == "device":
            layer.special(name, tarfile.CHRTYPE)
        else:
            target = draw(st.sampled_from([outside, f"{outside}/file", "../../..", "a", "a/b", "/etc"]))
            layer.link(name, target, hard=kind == "hardlink")
    return layer


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_nothing_outside_the_store_is_touched(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        outside = root / "outside"
        outside.mkdir()
        (outside / "file").write_bytes(b"original")
        before = _snapshot(outside)
        layer = data.draw(_layer(str(outside)))
        images.write_oci_layout(root / "layout", [layer.tar()])
        store = ImageStore(root / "store", max_bytes=1 << 20)
        store.open()
        try:
            image, _ = import_image(store, root / "layout", name="hostile")
        except (InvalidArgumentError, ResourceExhaustedError):
            index = store.index()
            assert (index.images, index.layers) == ({}, {})
            assert list((root / "store" / "layers" / "sha256").iterdir()) == []
        else:
            layer_root = store.layer_path(image.layers[0])
            for path in layer_root.rglob("*"):
                assert path.parent.resolve().is_relative_to(layer_root.resolve())
                assert not path.is_block_device()
                assert not path.is_char_device()
                if path.is_file() and not path.is_symlink():
                    assert not path.stat().st_mode & 0o6000
        assert list((root / "store" / "staging").iterdir()) == []
        assert _snapshot(outside) == before
        assert sorted(p.name for p in root.iterdir()) == ["layout", "outside", "store"]
