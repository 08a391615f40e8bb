"""`image import`'s progress bar: drawn in place on stderr for a big source, never for a small one."""

from __future__ import annotations

import pytest

from warmshell.cli import image
from warmshell.sdk.images import ImportProgress


def test_the_bar_is_drawn_in_place_for_big_sources(capsys: pytest.CaptureFixture[str]) -> None:
    bar = image._Bar()
    bar(ImportProgress("sending", 1 << 20, 1 << 30))
    bar(ImportProgress("unpacking", 3 << 28, 1 << 30, layers_done=2, layers=4))
    bar.close()
    err = capsys.readouterr().err
    assert err.startswith("\rsending   [")
    assert err.endswith("\n")
    assert "\runpacking [" + "#" * 22 + "." * 8 + "]  75% layer 2/4" in err


def test_no_bar_for_small_sources(capsys: pytest.CaptureFixture[str]) -> None:
    bar = image._Bar()
    bar(ImportProgress("sending", 10, 100))
    bar.close()
    assert capsys.readouterr().err == ""
