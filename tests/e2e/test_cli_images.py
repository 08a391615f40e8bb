"""`warmshell image ...` against a real gateway process: import of an OCI layout, an OCI archive
and a docker save tarball built by the tests, list, inspect -o json, rm and prune; bad input and
the store's bound as exit codes; a gateway killed (SIGKILL) mid-import leaves a consistent store."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import images
from tests.helpers.cli import CliGateway, start_gateway, warmshell_env, warmshell_executable
from tests.helpers.images import Layer
from warmshell.cli.errors import ExitCode


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    root = tmp_path_factory.mktemp("images")
    config = root / "gateway.toml"
    config.write_text('[local]\nimage_store_size = "48Mi"\n')
    running = start_gateway(root / "state", "--config", str(config))
    try:
        yield running
    finally:
        assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    base = images.host_shell_layer().tar()
    app = Layer().directory("app").file("app/hello", b"hello\n").tar()
    config = images.config_json(
        [base, app], Env=["PATH=/bin", "GREETING=hi"], Entrypoint=["/bin/sh", "-c"], Cmd=["cat /app/hello"],
        WorkingDir="/app", User="1000", Labels={"org.example.team": "sandbox"},
    )  # fmt: skip
    images.write_oci_layout(root / "layout", [base, app], config=config)
    images.tar_directory(root / "layout", root / "oci.tar")
    images.write_docker_save(root / "save.tar", [base], repo_tags=["test/base:saved"])
    return {"layout": root / "layout", "archive": root / "oci.tar", "docker": root / "save.tar"}


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_list_inspect_remove_prune(gateway: CliGateway, sources: dict[str, Path]) -> None:
    digest = _ok(gateway.run("image", "import", str(sources["layout"]), "--name", "test/app:1")).strip()
    assert digest.startswith("sha256:")
    assert _ok(gateway.run("image", "import", str(sources["archive"]), "--name", "test/app:2")).strip() == digest
    _ok(gateway.run("image", "import", str(sources["docker"])))
    listed = _ok(gateway.run("image", "list")).splitlines()
    assert listed[0].split() == ["NAME", "TAG", "DIGEST", "SIZE", "LAYERS", "CREATED"]
    rows = {tuple(line.split()[:2]): line.split() for line in listed[1:]}
    assert set(rows) == {("test/app", "1"), ("test/app", "2"), ("test/base", "saved")}
    assert rows[("test/app", "1")][2] == digest.removeprefix("sha256:")[:12]
    assert rows[("test/app", "1")][4] == "2"
    shown = json.loads(_ok(gateway.run("image", "inspect", "test/app:1", "-o", "json")))
    assert shown["digest"] == digest
    assert shown["config"] == {
        "env": ["PATH=/bin", "GREETING=hi"], "entrypoint": ["/bin/sh", "-c"], "cmd": ["cat /app/hello"],
        "working_dir": "/app", "user": "1000", "labels": {"org.example.team": "sandbox"},
    }  # fmt: skip
    assert len(shown["layers"]) == 2
    store = json.loads(_ok(gateway.run("image", "list", "-o", "json")))
    assert store["store_bytes"] == sum(layer["size"] for layer in shown["layers"])  # the base layer is shared
    assert _ok(gateway.run("image", "rm", "test/app:1")).strip() == "untagged test/app:1"
    assert _ok(gateway.run("image", "rm", "test/app:2")).strip() == f"removed {digest}"
    assert _ok(gateway.run("image", "rm", "test/base:saved")).startswith("removed sha256:")
    assert _ok(gateway.run("image", "prune")).strip() == "nothing to prune"
    assert json.loads(_ok(gateway.run("image", "list", "-o", "json"))).get("store_bytes", 0) == 0


def test_errors_are_exit_codes_naming_the_problem(gateway: CliGateway, tmp_path: Path) -> None:
    missing = gateway.run("image", "inspect", "nothing:here")
    assert missing.returncode == ExitCode.NOT_FOUND, missing.stderr
    assert "warmshell image import" in missing.stderr
    bad = tmp_path / "bad"
    digest = images.write_oci_layout(bad, [Layer().file("x", b"x").tar()])
    (bad / "blobs" / "sha256" / digest.removeprefix("sha256:")).write_text("{not json")
    refused = gateway.run("image", "import", str(bad), "--name", "bad:1")
    assert refused.returncode == ExitCode.INVALID_ARGUMENT, refused.stderr
    assert f"blobs/sha256/{digest.removeprefix('sha256:')}" in refused.stderr
    big = tmp_path / "big"
    images.write_oci_layout(big, [Layer().file("zeros", os.urandom(1 << 20) * 60).tar()], compress=False)
    over = gateway.run("image", "import", str(big), "--name", "big:1")
    assert over.returncode == ExitCode.RESOURCE_EXHAUSTED, over.stderr
    assert "local.image_store_size" in over.stderr
    assert json.loads(_ok(gateway.run("image", "list", "-o", "json"))).get("images", []) == []


def test_a_gateway_killed_mid_import_restarts_with_a_consistent_store(tmp_path: Path) -> None:
    layers = images.slow_layers(4, files=300, file_bytes=32 << 10)
    images.write_oci_layout(tmp_path / "layout", layers)
    state = tmp_path / "state"
    running = start_gateway(state)
    staging = state / "images" / "staging"
    importer = subprocess.Popen(
        [warmshell_executable(), "image", "import", str(tmp_path / "layout"), "--name", "crash:1"],
        env=warmshell_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(staging.glob("import-*/*")):
            time.sleep(0.01)
        assert list(staging.glob("import-*/*")), running.log()
        os.kill(running.process.pid, signal.SIGKILL)
        running.process.wait()
    finally:
        importer.communicate(timeout=60)
    assert importer.returncode != 0
    (state / "gateway.json").unlink()  # the killed gateway's: the restart announces itself anew
    restarted = start_gateway(state)
    try:
        assert json.loads(_ok(restarted.run("image", "list", "-o", "json"))).get("images", []) == []
        assert list(staging.iterdir()) == []
        assert list((state / "images" / "layers" / "sha256").iterdir()) == []
        _ok(restarted.run("image", "import", str(tmp_path / "layout"), "--name", "crash:1"))
        assert len(list((state / "images" / "layers" / "sha256").iterdir())) == len(layers)
    finally:
        assert restarted.stop() == 0, restarted.log()
        shutil.rmtree(state / "images", ignore_errors=True)
