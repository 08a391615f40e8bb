"""The one shape every module of the Kubernetes driver sees an API object in: the JSON the API
server speaks, as plain dicts (`kube` returns them, the pure modules read and render them)."""

from __future__ import annotations

from typing import Any

__all__ = ["Obj"]

Obj = dict[str, Any]
"""A Kubernetes object (or list, or event) as decoded JSON."""
