"""Attacks from inside a pod on the removal of its directory: a container plants symlinks to
the host's files where the kubelet will walk when the pod goes; the host's files stay."""

from __future__ import annotations

import pathlib

from ksc_helpers import NS, get_or_none, wait_for, wait_gone

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc


def _planting_pod(outside: pathlib.Path) -> dict[str, object]:
    # The container writes where its volumes are on the host and where its pod root is: links to
    # a host directory and a host file, a directory link in place of a mount path's parent, and
    # a deep tree for the walk to go through.
    script = (
        'set -e; for d in "$KUBESIM_POD_ROOT" "$KUBESIM_POD_ROOT/scratch"; do '
        f'ln -s {outside}/dir "$d/to-dir"; ln -s {outside}/file "$d/to-file"; '
        'mkdir -p "$d/deep/a/b/c"; ln -s {outside}/dir "$d/deep/a/b/c/up"; done; '
        'touch "$KUBESIM_POD_ROOT/planted"; sleep 3600'
    ).replace("{outside}", str(outside))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "planter"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }


async def test_symlinks_planted_by_a_container_are_not_followed_when_its_pod_goes(
    cluster: RunningCluster, api: kc.KubeClient, tmp_path: pathlib.Path
) -> None:
    outside = tmp_path / "host"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "keep").write_text("precious")
    (outside / "file").write_text("precious")
    created = await api.create(kc.PODS, NS, _planting_pod(outside))
    root = cluster.pod_root
    assert root is not None
    uid = created["metadata"]["uid"]

    async def planted() -> bool:
        return any(p.name.endswith(uid[:8]) and (p / "planted").exists() for p in root.iterdir())

    await wait_for(planted, bool, what="the links planted")
    await api.delete(kc.PODS, NS, "planter")
    await wait_gone(api, kc.PODS, "planter")

    def intact() -> bool:
        keep, file = outside / "dir" / "keep", outside / "file"
        return keep.exists() and keep.read_text() == "precious" and file.exists() and file.read_text() == "precious"

    async def removal() -> tuple[bool, bool]:
        return not any(p.name.endswith(uid[:8]) for p in root.iterdir()), intact()

    gone, kept = await wait_for(removal, lambda seen: seen[0] or not seen[1], what="the pod directory removed")
    assert kept, "the removal of the pod directory followed a link out of it"
    assert gone
    assert await get_or_none(api, kc.PODS, "planter") is None
