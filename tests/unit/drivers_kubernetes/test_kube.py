"""The adapter's boundary: statuses to exceptions, and the retry policy as data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from warmshell.core.errors import (
    AlreadyExistsError,
    ConflictError,
    FailedPreconditionError,
    NotFoundError,
    UnavailableError,
)
from warmshell.drivers.kubernetes import kube

from .fakes import config


def status_body(code: int, reason: str) -> bytes:
    return json.dumps({"kind": "Status", "code": code, "reason": reason, "message": f"{reason} happened"}).encode()


@pytest.mark.parametrize(
    ("code", "reason", "cls", "domain"),
    [
        (404, "NotFound", kube.NotFound, NotFoundError),
        (409, "AlreadyExists", kube.AlreadyExists, AlreadyExistsError),
        (409, "Conflict", kube.Conflict, ConflictError),
        (410, "Expired", kube.Gone, kube.ApiError),
        (429, "TooManyRequests", kube.Temporary, UnavailableError),
        (500, "InternalError", kube.Temporary, UnavailableError),
        (503, "ServiceUnavailable", kube.Temporary, UnavailableError),
        (504, "Timeout", kube.Temporary, UnavailableError),
        (403, "Forbidden", kube.Rejected, FailedPreconditionError),
        (422, "Invalid", kube.Rejected, FailedPreconditionError),
    ],
)
def test_statuses_map_to_exceptions(code: int, reason: str, cls: type[Exception], domain: type[Exception]) -> None:
    error = kube.error_for(code, status_body(code, reason))
    assert type(error) is cls
    assert isinstance(error, domain)
    assert error.status == code
    assert f"{reason} happened" in str(error)


def test_retry_after_is_read_and_capped() -> None:
    assert kube.error_for(429, b"", {"Retry-After": "2"}).retry_after == 2.0
    assert kube.error_for(429, b"", {"Retry-After": "3600"}).retry_after == kube.MAX_RETRY_AFTER_SECONDS
    assert kube.error_for(429, b"", {"Retry-After": "soon"}).retry_after is None
    assert kube.error_for(500, b"not json").api_message == "not json"


def test_resource_paths() -> None:
    sandboxes = kube.sandboxes("v1beta1")
    assert sandboxes.path("ns") == "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes"
    assert sandboxes.path("ns", "x", "status") == "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/x/status"
    assert kube.PODS.path("ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert kube.TOKEN_REVIEWS.path("") == "/apis/authentication.k8s.io/v1/tokenreviews"
    assert sandboxes.api_version == "agents.x-k8s.io/v1beta1"
    assert kube.PODS.api_version == "v1"


class Flaky:
    """Fails with the given errors, then answers."""

    def __init__(self, *errors: kube.ApiError) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def temporary(code: int) -> kube.Temporary:
    return kube.Temporary(code, "X", "x", retry_after=0.0 if code == 429 else None)


async def test_temporary_failures_are_retried_up_to_the_policy() -> None:
    policy = kube.RetryPolicy((0.0, 0.0))
    call = Flaky(temporary(500), temporary(503))
    assert await policy.run("get", call) == "ok"
    assert call.calls == 3
    call = Flaky(temporary(500), temporary(500), temporary(500))
    with pytest.raises(kube.Temporary):
        await policy.run("get", call)
    assert call.calls == policy.attempts == 3


async def test_an_unprocessed_write_is_retried_but_an_ambiguous_one_is_not() -> None:
    policy = kube.RetryPolicy((0.0, 0.0))
    call = Flaky(temporary(429))
    assert await policy.run("create", call, only_unprocessed=True) == "ok"
    call = Flaky(temporary(500))
    with pytest.raises(kube.Temporary):
        await policy.run("create", call, only_unprocessed=True)
    assert call.calls == 1


async def test_permanent_failures_are_not_retried() -> None:
    call = Flaky(kube.NotFound(404, "NotFound", "gone"))
    with pytest.raises(kube.NotFound):
        await kube.RetryPolicy((0.0,)).run("get", call)
    assert call.calls == 1


async def test_attempts_are_logged_as_n_of_total(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    await kube.RetryPolicy((0.0, 0.0)).run("get pods", Flaky(temporary(500)))
    assert "attempt 2/3" in caplog.text


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.1.2.3:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: not-a-secret}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize(
    ("environment", "proxy"),
    [
        ({"HTTPS_PROXY": "http://proxy.example:3128"}, "http://proxy.example:3128"),
        ({"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "10.1.2.3"}, None),
        ({}, None),
    ],
)
async def test_the_proxy_is_read_from_the_environment_once_not_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], proxy: str | None
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    api = await kube.Kube.connect(config(kubeconfig=str(path), credentials="kubeconfig"))
    try:
        rest = api._api.rest_client
        assert rest.proxy == proxy
        # No per-request look-up of proxy variables and ~/.netrc (a thread hop each time).
        assert rest.pool_manager.trust_env is False
    finally:
        await api.aclose()
