"""Sandboxes from images of the image store, through a real gateway: the image's layers are the
root, read-only and shared, under a writable layer of each sandbox's own; the reference is pinned
to its digest; an unknown image is refused naming `spec.image` and how to import it."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import grpc
import pytest

from tests.helpers import debian, images
from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from tests.integration.drivers_local.support import needs_bwrap
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="written for a root gateway (a uid per sandbox); a normal user's: test_image_user_gateway.py",
    ),
]


TOOLS = ("cat", "chmod", "cp", "cut", "grep", "head", "id", "ln", "ls", "mkdir", "mount", "rm", "sleep", "umount")


def tools_layer(marker: str, *, setuid: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> images.Layer:
    """The host's /bin/sh and a few coreutils with the libraries they load, and a marker; the
    `setuid` tools with their setuid bit set."""
    layer = images.host_shell_layer(marker)
    have = {info.name for info, _ in layer.members}
    for tool in (*TOOLS, *extra):
        path = f"/usr/bin/{tool}"
        ldd = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
        for source in [path, *re.findall(r"=> (/\S+) \(0x", ldd)]:
            real = os.path.realpath(source).strip("/")
            if real not in have:
                have.add(real)
                layer.file(real, Path("/" + real).read_bytes(), mode=0o4755 if tool in setuid else 0o755)
            name = source.strip("/")
            if name not in have:  # /lib is a link to usr/lib on the host: the image gets one too
                have.add(name)
                layer.link(name, "/" + real)
    return layer


def import_tiny(
    state: Path,
    source: Path,
    *,
    name: str = "tiny:1",
    marker: str = "built by the tests",
    setuid: tuple[str, ...] = (),
    extra_tools: tuple[str, ...] = (),
    **config: object,
) -> str:
    """Import a one-layer image (the host's /bin/sh and a few tools, a marker) into the gateway's
    store, with runtime `config` (Env, WorkingDir, User...); its digest."""
    layer = tools_layer(marker, setuid=setuid, extra=extra_tools).tar()
    runtime = images.config_json([layer], **config) if config else None
    images.write_oci_layout(source, [layer], config=runtime)
    store = ImageStore(state / "images", max_bytes=1 << 30)
    store.open()
    image, _ = import_image(store, source, name=name)
    return image.digest


async def ready(gw: RunningGateway, name: str, image: str) -> pb.Sandbox:
    """A Ready sandbox of `image` that runs nothing but its agent (its Cmd, a shell, would exit
    at once on an empty stdin, as under docker)."""
    await gw.create(name=name, spec=pb.SandboxSpec(image=image, no_command=True))
    sandbox = await gw.wait_ready(name)
    assert sandbox.status.phase == pb.SANDBOX_PHASE_READY, sandbox
    return sandbox


async def sh(gw: RunningGateway, name: str, script: str) -> tuple[int, str, str]:
    code, out, err = await gw.exec(name, ["/bin/sh", "-c", script])
    return code, out.decode(), err.decode()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


async def test_a_sandbox_runs_on_its_image_with_a_writable_layer_of_its_own(state: Path, tmp_path: Path) -> None:
    digest = import_tiny(state, tmp_path / "tiny")
    layer = next((state / "images" / "layers" / "sha256").iterdir())
    before = {p.relative_to(layer): p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    async with running_gateway(state) as gw:
        first = await ready(gw, "one", "tiny:1")
        assert first.spec.image == f"tiny:1@{digest}"  # pinned: what it runs, whatever the tag names later
        assert await sh(gw, "one", "cat /etc/warmshell-test-marker") == (0, "built by the tests", "")
        assert (await sh(gw, "one", "[ -e /usr/bin/python3 ] || echo no-host-usr"))[1] == "no-host-usr\n"
        code, out, _ = await sh(gw, "one", "echo changed > /etc/warmshell-test-marker && mkdir -p /usr/lib/x && "
                                "echo new > /usr/lib/x/f && cat /etc/warmshell-test-marker /usr/lib/x/f")  # fmt: skip
        assert (code, out) == (0, "changed\nnew\n")
        await ready(gw, "two", f"sha256:{digest.removeprefix('sha256:')}")
        assert await sh(gw, "two", "cat /etc/warmshell-test-marker; ls /usr/lib/x >/dev/null 2>&1 || echo absent") == (
            0,
            "built by the testsabsent\n",
            "",
        )
        # Everything else is as for any sandbox: the agent is pid 1, /workspace and /tmp are there.
        code, out, _ = await sh(gw, "one", "cat /proc/1/comm; cd /workspace && : > w && cd /tmp && : > t && pwd")
        assert (code, out) == (0, "warmshell-agent\n/tmp\n")
    after = {p.relative_to(layer): p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    assert after == before  # nothing reached the store


async def test_an_unknown_image_is_refused_naming_the_field_and_how_to_import_it(state: Path) -> None:
    async with running_gateway(state) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.create(name="nope", spec=pb.SandboxSpec(image="python:3.12"))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = caught.value.details() or ""
        assert details.startswith("spec.image: "), details
        assert "warmshell image import" in details, details


async def test_the_upper_layer_is_bounded_by_local_root_size(state: Path, tmp_path: Path) -> None:
    import_tiny(state, tmp_path / "tiny")
    async with running_gateway(state, **{"local.root_size": "4Mi"}) as gw:
        await ready(gw, "small", "tiny:1")
        code, _, err = await sh(gw, "small", "head -c 8388608 /dev/zero > /etc/big")
        assert code != 0
        assert "No space left" in err, err


def _pool_reason(response: pb.ListPoolsResponse, name: str) -> str:
    pool = pool_named(response, name)
    return next((c.reason for c in pool.conditions if c.status == "False"), "") if pool is not None else ""


async def test_pools_per_image_serve_their_image_only_and_roll_when_the_tag_moves(state: Path, tmp_path: Path) -> None:
    first = import_tiny(state, tmp_path / "one", name="tiny:1", marker="one")
    other = import_tiny(state, tmp_path / "two", name="other:1", marker="two")
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "tiny.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 1\nimage = "tiny:1"\n')
    (pools / "gone.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 1\nimage = "nowhere:1"\n')
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(state, **settings) as gw:
        listed = await wait_pools(gw, lambda r: (p := pool_named(r, "tiny")) is not None and p.idle >= 1)
        assert pool_named(listed, "tiny").image == f"tiny:1@{first}"  # type: ignore[union-attr]
        assert _pool_reason(listed, "gone") == "ImageNotFound"
        warm = await ready(gw, "warm", "tiny:1")
        assert (warm.status.allocation, warm.status.pool) == ("warm", "tiny")
        assert await sh(gw, "warm", "cat /etc/warmshell-test-marker") == (0, "one", "")
        cold = await ready(gw, "cold", "other:1")  # another image: never the tiny pool's member
        assert cold.status.allocation == "cold"
        assert cold.spec.image == f"other:1@{other}"
        # The tag now names the other image: the pool's idle member is replaced by one of it.
        import_tiny(state, tmp_path / "three", name="tiny:1", marker="three")
        await wait_pools(
            gw, lambda r: (p := pool_named(r, "tiny")) is not None and first not in p.image and p.idle >= 1
        )
        again = await ready(gw, "again", "tiny:1")
        assert again.status.allocation == "warm"
        assert await sh(gw, "again", "cat /etc/warmshell-test-marker") == (0, "three", "")
        assert await sh(gw, "warm", "cat /etc/warmshell-test-marker") == (0, "one", "")  # handed out: kept


async def test_removing_an_image_a_live_sandbox_runs_keeps_its_layers_until_it_ends(
    state: Path, tmp_path: Path
) -> None:
    import_tiny(state, tmp_path / "tiny")
    store = ImageStore(state / "images", max_bytes=1 << 30)
    layers = state / "images" / "layers" / "sha256"
    async with running_gateway(state) as gw:
        await ready(gw, "live", "tiny:1")
        removed = store.remove("tiny:1")
        assert (removed.images, removed.layers) == ((removed.images[0],), 0)  # the image went, its layer stayed
        assert await sh(gw, "live", "cat /etc/warmshell-test-marker; ls /usr/bin/ls") == (
            0,
            "built by the tests/usr/bin/ls\n",
            "",
        )
        await gw.delete("live")
        async with asyncio.timeout(10):
            while store.prune().layers == 0:  # the sandbox's end lets go of the layer
                await asyncio.sleep(0.05)
    assert list(layers.iterdir()) == []


async def test_the_image_config_gives_the_environment_directory_and_user(state: Path, tmp_path: Path) -> None:
    env = ["PATH=/usr/bin:/bin", "GREETING=hello", "BOTH=image"]
    import_tiny(state, tmp_path / "tiny", Env=env, WorkingDir="/etc", User="1234:55")
    async with running_gateway(state) as gw:
        spec = pb.SandboxSpec(image="tiny:1", environment={"BOTH": "request"}, no_command=True)
        await gw.create(name="cfg", spec=spec)
        assert (await gw.wait_ready("cfg")).status.phase == pb.SANDBOX_PHASE_READY
        script = "echo $GREETING $BOTH; pwd; id -u; id -g; ls -nd /etc | cut -d' ' -f3"
        # The image's files show as its user's: it is the sandbox's own host uid inside.
        assert await sh(gw, "cfg", script) == (0, "hello request\n/etc\n1234\n55\n1234\n", "")
        assert (await sh(gw, "cfg", "cd /workspace && pwd"))[1] == "/workspace\n"  # an exec's own directory


async def test_a_debian_image_takes_package_like_writes_into_its_own_directories(state: Path, tmp_path: Path) -> None:
    debian.write_debian_docker_save(tmp_path / "debian.tar", debian.debian_rootfs_tar(), tag="debian:bookworm")
    store = ImageStore(state / "images", max_bytes=4 << 30)
    store.open()
    import_image(store, tmp_path / "debian.tar")
    async with running_gateway(state) as gw:
        await ready(gw, "builder", "debian:bookworm")
        # What `pip install` or `apt-get install` does: new files under /usr, a changed /etc and
        # package database, a removed file.
        script = (
            "set -e; mkdir -p /usr/lib/python3/dist-packages/tool; "
            "echo 'print(1)' > /usr/lib/python3/dist-packages/tool/__init__.py; "
            "echo 'deb http://example.invalid/ x main' > /etc/apt/sources.list.d/extra.list; "
            "printf 'Package: tool\\nStatus: install ok installed\\nVersion: 1\\nMaintainer: t\\nArchitecture: all\\n"
            "Description: t\\n\\n' >> /var/lib/dpkg/status; "
            "rm /usr/share/doc/dash/copyright; dpkg-query -W -f='${Status}' tool; echo; cat /etc/debian_version"
        )
        code, out, err = await sh(gw, "builder", script)
        assert (code, err) == (0, ""), err
        assert out.splitlines()[0] == "install ok installed"
        assert out.splitlines()[1].startswith("12")
        await ready(gw, "clean", "debian:bookworm")
        check = "ls /usr/lib/python3/dist-packages/tool /etc/apt/sources.list.d/extra.list 2>&1 | wc -l; "
        check += "ls /usr/share/doc/dash/copyright; dpkg-query -W tool 2>&1 | head -1"
        _, out, _ = await sh(gw, "clean", check)
        assert out.splitlines()[0] == "2"  # two "No such file or directory": neither is there
        assert out.splitlines()[1] == "/usr/share/doc/dash/copyright"
        assert "no packages found matching tool" in out
