"""Install the agent-sandbox CRDs into the API server, as the agent-sandbox chart does in a cluster.

The manifests are verbatim upstream copies (``crds/``); creating them registers the four resources
with the API server, which then serves and validates them like any CRD.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from typing import Any

import yaml

from kubesim.controllers import client as kc

CRDS = kc.Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)


@functools.cache
def _parsed() -> tuple[str, ...]:
    # Parsing ~800 kB of YAML costs a second in pure Python; do it once, with libyaml if present.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    folder = importlib.resources.files("kubesim.controllers") / "crds"
    out: list[str] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            out.append(json.dumps(yaml.load(entry.read_text(), Loader=loader)))
    return tuple(out)


def manifests() -> list[dict[str, Any]]:
    """The four CRD objects (fresh copies)."""
    return [json.loads(text) for text in _parsed()]


async def install_crds(api: kc.KubeClient) -> None:
    """Create the CRDs that are missing (idempotent)."""
    for crd in manifests():
        try:
            await api.create(CRDS, None, crd)
        except kc.ApiError as exc:
            if not exc.already_exists:
                raise
