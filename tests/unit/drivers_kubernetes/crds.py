"""The agent-sandbox CRD schemas, as kubesim ships them (verbatim upstream copies), as strict
JSON-schema validators: unknown fields are errors here, where a real API server would silently
prune them — a misspelt field in our rendering must fail a test, not vanish in the cluster."""

from __future__ import annotations

import copy
import functools
import importlib.resources
from typing import Any

import jsonschema
import yaml

CRD_FILES = {
    "Sandbox": "agents.x-k8s.io_sandboxes.yaml",
    "SandboxClaim": "extensions.agents.x-k8s.io_sandboxclaims.yaml",
    "SandboxTemplate": "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
    "SandboxWarmPool": "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
}


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def validator(kind: str, version: str) -> jsonschema.protocols.Validator:
    """A strict validator for `kind` at `version` (the CRD's openAPIV3Schema)."""
    text = (importlib.resources.files("kubesim.controllers") / "crds" / CRD_FILES[kind]).read_text()
    crd = yaml.safe_load(text)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(copy.deepcopy(served["schema"]["openAPIV3Schema"]))
    # metadata is `type: object` only in CRDs; the API server checks it, not the schema.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def errors(obj: dict[str, Any], *, version: str = "v1beta1") -> list[str]:
    """Schema violations of `obj`, each with its path."""
    found = validator(obj["kind"], version).iter_errors(obj)
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in found]
