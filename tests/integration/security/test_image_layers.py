"""Attacks from inside a sandbox that runs an image of the image store: its layers are shared by
every sandbox of the image, so they and the store must stay read-only whatever the workload does
(its writes land in its own upper layer); another sandbox's upper layer must be out of reach; a
setuid binary in an image must give nothing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.helpers.gateway import running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny, ready, sh
from warmshell.core.config import LocalDriverConfig

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="written for a root gateway (a uid per sandbox); a normal user's: test_image_user_gateway.py",
    ),
]


def _hashes(root: Path) -> dict[str, str]:
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        found[str(path.relative_to(root))] = f"{info.st_mode:o}:{info.st_uid}:{hashlib.sha256(data).hexdigest()}"
    return found


async def test_the_layers_and_the_store_stay_read_only_from_inside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny")
    store = state / "images"
    before = _hashes(store)
    async with running_gateway(state) as gw:
        await ready(gw, "attacker", "tiny:1")
        # Everything writable from inside is the upper layer: overwrite, delete, chmod, link.
        script = (
            "echo owned > /etc/warmshell-test-marker; rm -f /usr/bin/ls; chmod 777 /usr/bin/cat; "
            "ln -s /etc /usr/evil; mkdir -p /usr/lib/new && echo x > /usr/lib/new/f; echo done"
        )
        assert await sh(gw, "attacker", script) == (0, "done\n", "")
        # The mounts themselves: no remount, no unmount, and nothing names a host path.
        code, _, _ = await sh(gw, "attacker", "mount -o remount,rw / 2>/dev/null || umount / 2>/dev/null")
        assert code != 0
        _, mounts, _ = await sh(gw, "attacker", "cat /proc/self/mountinfo")
        assert str(store) not in mounts
        assert str(tmp_path) not in mounts
        assert (await sh(gw, "attacker", f"ls {store} >/dev/null 2>&1 || echo unreachable"))[1] == "unreachable\n"
    assert _hashes(store) == before  # not one byte, mode or owner of the store changed


async def test_another_sandboxs_upper_layer_is_out_of_reach(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny")
    rootfs = LocalDriverConfig().sandbox_dir / "rootfs"
    async with running_gateway(state) as gw:
        await ready(gw, "victim", "tiny:1")
        await ready(gw, "attacker", "tiny:1")
        assert (await sh(gw, "victim", "echo s3cret > /etc/secret && echo ok"))[1] == "ok\n"
        script = (
            "cat /etc/secret 2>/dev/null; ls /proc | grep -c '^[0-9]'; ls -A /proc/1/root/etc/secret 2>&1 | head -1"
        )
        _, out, _ = await sh(gw, "attacker", script)
        assert "s3cret" not in out
        # Each sandbox's overlay and its upper tmpfs exist only in its own mount namespace: the
        # host's mount point stays an empty directory, with nothing mounted on it.
        assert os.listdir(rootfs) == []
        assert str(rootfs) not in Path("/proc/self/mountinfo").read_text()


async def test_a_setuid_binary_in_an_image_gives_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # The image's User is not root inside; its `id` is setuid-root in the archive.
    import_tiny(state, tmp_path / "tiny", setuid=("id",), Env=["PATH=/usr/bin:/bin"], User="1234:1234")
    layer = next((state / "images" / "layers" / "sha256").iterdir())
    assert not (layer / "usr" / "bin" / "id").stat().st_mode & 0o6000  # the import stripped it already
    async with running_gateway(state) as gw:
        await ready(gw, "suid", "tiny:1")
        # Made setuid again inside (the file is the sandbox's own there): the mount is nosuid and
        # the user namespace has no other uid to become.
        script = "cp /usr/bin/id /tmp/id; chmod 4755 /usr/bin/id /tmp/id; /usr/bin/id -u; /tmp/id -u"
        assert await sh(gw, "suid", script) == (0, "1234\n1234\n", "")
