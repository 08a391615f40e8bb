"""`Sandbox.snapshot` on the sync client (both transports) and the async one, and `warmshell
sandbox snapshot` / `image inspect`, against a real gateway process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers import images
from tests.helpers.cli import CliGateway, start_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import tools_layer
from warmshell.sdk import building

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    running = start_gateway(tmp_path_factory.mktemp("sdk-snapshots") / "state")
    layout = tmp_path_factory.mktemp("layout")
    layer = tools_layer("base").tar()
    # No Cmd: a sandbox of the image runs nothing but its agent (a shell as Cmd would exit at once).
    images.write_oci_layout(layout, [layer], config=images.config_json([layer], Env=["PATH=/usr/bin:/bin"]))
    try:
        with warmshell.Client(state_dir=running.state_dir) as client:
            client.images.import_(layout, name="tools:1")
        yield running
    finally:
        assert running.stop() == 0, running.log()


@pytest.mark.parametrize("transport", ["grpcio", "http2"])
def test_the_sync_client_snapshots_a_sandbox(gateway: CliGateway, transport: str) -> None:
    with warmshell.Client(state_dir=gateway.state_dir, transport=transport) as client:
        with client.create(name=f"prep-{transport}", image="tools:1", auto_delete=True) as sandbox:
            sandbox.run(["/bin/sh", "-c", "echo ready > /workspace/state"])
            taken = sandbox.snapshot(f"prepared-{transport}:1")
            assert taken.pinned == f"prepared-{transport}:1@{taken.digest}"
            assert taken.layers == 2
            with pytest.raises(warmshell.AlreadyExists, match="--force"):
                sandbox.snapshot(f"prepared-{transport}:1")
        with client.create(name=f"child-{transport}", image=taken.pinned, auto_delete=True) as child:
            assert child.run(["/bin/sh", "-c", "cat /workspace/state"]).stdout == b"ready\n"


def test_the_async_client_and_the_cli_snapshot_a_sandbox(gateway: CliGateway) -> None:
    async def scenario() -> str:
        async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
            sandbox = await client.create(name="prep-async", image="tools:1")
            await sandbox.run(["/bin/sh", "-c", "echo async > /workspace/state"])
            taken = await sandbox.snapshot("prepared-async:1")
            return taken.digest

    digest = asyncio.run(scenario())
    done = gateway.run("sandbox", "snapshot", "prep-async", "--as", "prepared-async:2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("prepared-async:2@sha256:"), done.stdout
    shown = gateway.run("image", "inspect", "prepared-async:1")
    assert "Snapshot of: default/prep-async" in shown.stdout, shown.stdout
    assert digest in shown.stdout
    refused = gateway.run("sandbox", "snapshot", "prep-async", "--as", "prepared-async:2")
    assert refused.returncode != 0
    assert "--force" in refused.stderr
    assert gateway.run("sandbox", "snapshot", "prep-async", "--as", "prepared-async:2", "--force").returncode == 0


def test_the_clients_and_the_cli_fork_a_sandbox(gateway: CliGateway) -> None:
    with (
        warmshell.Client(state_dir=gateway.state_dir) as client,
        client.create(name="forked", image="tools:1", auto_delete=True) as parent,
    ):
        parent.run(["/bin/sh", "-c", "echo state > /workspace/state"])
        children = parent.fork(2)
        assert [c.name for c in children if isinstance(c, warmshell.Sandbox)] == ["forked-fork-1", "forked-fork-2"]
        for child in children:
            assert isinstance(child, warmshell.Sandbox)
            assert child.run(["/bin/sh", "-c", "cat /workspace/state"]).stdout == b"state\n"
            child.delete()
        with pytest.raises(warmshell.InvalidArgument, match="count"):
            parent.fork(0)

        async def in_async() -> list[str]:
            async with warmshell.AsyncClient(state_dir=gateway.state_dir) as aclient:
                handle = await aclient.get("forked")
                made = await handle.fork(1, prefix="async")
                return [c.name for c in made if isinstance(c, warmshell.AsyncSandbox)]

        assert asyncio.run(in_async()) == ["async-1"]
        done = gateway.run("sandbox", "fork", "forked", "--count", "2", "--prefix", "cli")
        assert done.returncode == 0, done.stderr
        assert "cli-1  Ready" in done.stdout, done.stdout
        assert "cli-2  Ready" in done.stdout, done.stdout
        clash = gateway.run("sandbox", "fork", "forked", "--count", "1", "--prefix", "cli")
        assert clash.returncode != 0
        assert "prefix: " in clash.stderr
    for name in ("async-1", "cli-1", "cli-2"):
        gateway.run("sandbox", "delete", name)


def test_an_image_is_built_from_setup_steps_in_order_with_their_output_streamed(
    gateway: CliGateway, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.c").write_text("int main(void) { return 0; }\n")
    (tmp_path / "one.txt").write_text("one\n")
    done = gateway.run(
        "image", "build", "--from", "tools:1",
        "--copy", f"{tmp_path / 'src'}:/workspace/src",
        "--run", "echo compiling; ls /workspace/src > /workspace/built",
        "--copy", f"{tmp_path / 'one.txt'}:/opt/one.txt",
        "--run", "cat /opt/one.txt >> /workspace/built; echo to-stderr >&2",
        "--as", "built:1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "compiling\n" in done.stdout
    assert "step 1/4: copy" in done.stderr
    assert "to-stderr" in done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("built:1@sha256:")
    with warmshell.Client(state_dir=gateway.state_dir) as client:
        with client.create(name="from-built", image="built:1", auto_delete=True) as sandbox:
            assert sandbox.run(["/bin/sh", "-c", "cat /workspace/built"]).stdout == b"main.c\none\n"
        seen: list[tuple[str, bytes]] = []
        with pytest.raises(building.BuildFailed, match=r"step 2 \(run 'echo failing; exit 3'\) exited 3") as caught:
            client.build_image(
                "broken:1",
                base="tools:1",
                steps=[building.Run("echo ok"), building.Run("echo failing; exit 3"), building.Run("echo never")],
                output=lambda stream, chunk: seen.append((stream, chunk)),
            )
        assert caught.value.tail == b"failing\n"
        assert (b"never\n") not in b"".join(chunk for _, chunk in seen)
        with pytest.raises(warmshell.NotFound):
            client.images.get("broken:1")
        assert not [s.name for s in client.list() if s.name.startswith("build-")]  # the build sandboxes are gone
    failed = gateway.run("image", "build", "--from", "tools:1", "--run", "exit 7", "--as", "broken:2")
    assert failed.returncode == 1
    assert "step 1 (run 'exit 7') exited 7" in failed.stderr


def test_the_clients_and_the_cli_pause_and_resume_a_sandbox(gateway: CliGateway) -> None:
    with warmshell.Client(state_dir=gateway.state_dir) as client:
        sandbox = client.create(name="napper", image="tools:1")
        sandbox.run(["/bin/sh", "-c", "echo kept > /workspace/notes"])
        assert sandbox.pause().phase == warmshell.Phase.PAUSED
        assert client.get("napper").info().phase == warmshell.Phase.PAUSED
        resumed = client.resume("napper")
        assert resumed.run(["/bin/sh", "-c", "cat /workspace/notes"]).stdout == b"kept\n"

        async def in_async() -> str:
            async with warmshell.AsyncClient(state_dir=gateway.state_dir) as aclient:
                handle = await aclient.get("napper")
                await handle.pause(pause_ttl_seconds=3600)
                info = await handle.resume()
                return info.phase.value

        assert asyncio.run(in_async()) == "Ready"
    paused = gateway.run("sandbox", "pause", "napper")
    assert paused.returncode == 0, paused.stderr
    assert "Paused" in gateway.run("sandbox", "list").stdout
    resumed_cli = gateway.run("sandbox", "resume", "napper")
    assert resumed_cli.returncode == 0, resumed_cli.stderr
    assert gateway.run("sandbox", "exec", "napper", "--", "/bin/sh", "-c", "cat /workspace/notes").stdout == "kept\n"
    again = gateway.run("sandbox", "resume", "napper")
    assert again.returncode != 0
    assert "only a Paused sandbox" in again.stderr
    assert gateway.run("sandbox", "delete", "napper").returncode == 0
