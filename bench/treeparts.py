"""What a source tree renders for a Kubernetes benchmark, rendered by that tree's own code.

A benchmark that alternates an older tree (`--before-src`) with this one runs the older tree's
kubesim, gateways and pods from its `src/`; what the benchmark process itself renders for them must
come from that tree too: the gateways' driver settings (a setting this tree added is refused by an
older gateway's config, which forbids unknown keys), the pool's SandboxTemplate (this tree's pod
has an init container running `warmshell-agent --install`, which an older tree's pods cannot run)
and kubesim's image rules (the tree's pod shim). So `tree_parts` runs this file as a script with
the tree's `src/` and root first on the path, where it imports only what every tree since issue 20
has: the Kubernetes tests' conftest (`IMAGE`, `IMAGES`, `NAMESPACE`, `driver_config`),
`warmpools.render_pool_pair` and `SandboxShape`; and builds the tree's agent when it has one and
it is not built (an archived tree has the C sources only).

As a script: `python treeparts.py images` or `python treeparts.py render` (the request as JSON on
stdin), the answer as JSON on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["TreeConfig", "TreeParts", "tree_parts", "tree_root"]

_HERE = Path(__file__).resolve()


def tree_root(src: str) -> Path:
    """The whole tree of `src` (its parent), which must hold its tests (`git archive <commit> |
    tar -x`), for they hold the image rules and the driver settings its own tests use."""
    root = Path(src).resolve().parent
    if not (root / "tests" / "integration" / "drivers_kubernetes" / "conftest.py").is_file():
        raise SystemExit(
            f"--before-src {src}: its tree must hold its tests too (e.g. `git archive <commit> | tar -x -C DIR`,"
            " then --before-src DIR/src)"
        )
    return root


def _run(src: str, what: str, request: dict[str, Any]) -> dict[str, Any]:
    root = tree_root(src)
    # Only the tree: this tree's src on the path would let an import the tree lacks succeed here.
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    done = subprocess.run(
        [sys.executable, str(_HERE), what],
        input=json.dumps(request).encode(),
        capture_output=True,
        cwd=root,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the tree at {root} could not render its {what}:\n{done.stderr.decode()[-4000:]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


class TreeConfig:
    """A tree's Kubernetes driver settings, as the replica helper takes a driver config (it only
    dumps it into each gateway's config file)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = settings

    def model_dump(self) -> dict[str, Any]:
        """The settings, a fresh copy each time (the helper pops from what it gets)."""
        copied: dict[str, Any] = json.loads(json.dumps(self._settings))
        return copied


class TreeParts:
    """What one tree renders: its image name and kubesim image rules, and once a cluster and the
    gateways' address are known, its driver settings and its pool's SandboxTemplate and pool."""

    def __init__(self, src: str) -> None:
        self.src = src
        answer = _run(src, "images", {})
        self.image: str = answer["image"]
        self.images: dict[str, Any] = answer["images"]
        self.config = TreeConfig({})
        self._template: dict[str, Any] = {}
        self._pool: dict[str, Any] = {}

    def render(
        self,
        *,
        kubeconfig: str,
        gateway_address: str,
        api_timeout_seconds: float,
        name: str,
        environment: dict[str, str],
    ) -> None:
        """The tree's driver settings for this cluster and address, and its pool `name` of warm
        members with `environment` (`pool_pair` sizes it)."""
        answer = _run(
            self.src,
            "render",
            {
                "kubeconfig": kubeconfig,
                "gateway_address": gateway_address,
                "api_timeout_seconds": api_timeout_seconds,
                "name": name,
                "environment": environment,
            },
        )
        self.config = TreeConfig(answer["driver"])
        self._template, self._pool = answer["template"], answer["pool"]

    def pool_pair(self, size: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The rendered (SandboxTemplate, SandboxWarmPool), the pool of `size` members."""
        template, pool = json.loads(json.dumps([self._template, self._pool]))
        pool["spec"]["replicas"] = size
        return template, pool


def tree_parts(src: str) -> TreeParts:
    """`TreeParts` of the tree whose `src/` is `src` (its agent built first, when it has one that
    is not)."""
    tree_root(src)
    _build_agent(Path(src).resolve())
    return TreeParts(src)


def _build_agent(src: Path) -> None:
    """The tree's own agent and launcher, when its pods copy the agent from its source tree."""
    for building in src.glob("warmshell/drivers/local/**/agent/building.py"):
        if not (building.parent / "warmshell-agent").exists():
            subprocess.run([sys.executable, str(building)], check=True, stdout=subprocess.DEVNULL)


# -- run in the tree ---------------------------------------------------------------------------------


def _images() -> dict[str, Any]:
    from tests.integration.drivers_kubernetes import conftest

    return {"image": conftest.IMAGE, "images": conftest.IMAGES}


def _render(request: dict[str, Any]) -> dict[str, Any]:
    from types import SimpleNamespace

    from tests.integration.drivers_kubernetes import conftest
    from warmshell.core.fingerprints import SandboxShape
    from warmshell.drivers.kubernetes.warm import warmpools

    cluster = SimpleNamespace(kubeconfig=request["kubeconfig"])
    config = conftest.driver_config(
        cluster,
        Path("unused"),
        gateway_address=request["gateway_address"],
        api_timeout_seconds=request["api_timeout_seconds"],
    )
    shape = SandboxShape(workspace="default", image=conftest.IMAGE, environment=request["environment"])
    template, pool = warmpools.render_pool_pair(
        config, name=request["name"], namespace=conftest.NAMESPACE, shape=shape, replicas=1
    )
    return {"driver": config.model_dump(mode="json"), "template": template, "pool": pool}


def main() -> None:
    what = sys.argv[1]
    request = json.loads(sys.stdin.read() or "{}")
    answer = _images() if what == "images" else _render(request)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
