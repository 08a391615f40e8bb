"""Request paths → RequestInfo."""

from __future__ import annotations

import pytest

from kubesim.apiserver import routing
from kubesim.apiserver.routing import RequestInfo


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/v1/pods", RequestInfo("", "v1", "pods")),
        ("/api/v1/namespaces/ns/pods/p/status", RequestInfo("", "v1", "pods", "ns", "p", "status")),
        ("/api/v1/namespaces/ns", RequestInfo("", "v1", "namespaces", None, "ns")),
        ("/api/v1/namespaces/ns/finalize", RequestInfo("", "v1", "namespaces", None, "ns", "finalize")),
        ("/api/v1/namespaces/ns/configmaps/", RequestInfo("", "v1", "configmaps", "ns")),
        (
            "/apis/agents.x-k8s.io/v1beta1/watch/namespaces/ns/sandboxes",
            RequestInfo("agents.x-k8s.io", "v1beta1", "sandboxes", "ns", watch_prefix=True),
        ),
        (
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
            RequestInfo("coordination.k8s.io", "v1", "leases", "ns", "l"),
        ),
    ],
)
def test_parse(path: str, expected: RequestInfo) -> None:
    assert routing.parse(path) == expected


@pytest.mark.parametrize("path", ["/api", "/api/v1", "/apis", "/apis/g", "/apis/g/v1", "/version", "/a/b/c/d/e/f/g/h"])
def test_non_resource_paths(path: str) -> None:
    assert routing.parse(path) is None
