"""Response and body helpers shared by the HTTP layer."""

from __future__ import annotations

from typing import Any, Protocol

import yaml
from aiohttp import web
from multidict import MultiMapping

from kubesim.apiserver import errors, protobuf
from kubesim.jsonwire import dumps, loads

JSON = "application/json"


def json_response(
    body: Any, status: int = 200, *, headers: dict[str, str] | None = None, content_type: str = JSON
) -> web.Response:
    """A JSON response from a dict or pre-encoded bytes."""
    data = body if isinstance(body, bytes) else dumps(body)
    resp = web.Response(body=data, status=status, headers=headers)
    resp.headers["Content-Type"] = content_type
    return resp


def error_response(exc: errors.ApiError) -> web.Response:
    """The Status answer for an ApiError."""
    return json_response(exc.status(), exc.code, headers=exc.headers)


def decode_body(raw: bytes, content_type: str) -> Any:
    """Decode a JSON or YAML request body; protobuf/CBOR are 415 as on a JSON-only server."""
    if not raw:
        return None
    ct = content_type.split(";")[0].strip().lower()
    if ct in ("", "application/json", "*/*"):
        try:
            return loads(raw)
        except ValueError as exc:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc
    if ct in ("application/yaml", "application/x-yaml", "text/yaml"):
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"error decoding YAML: {exc}") from exc
    if ct == protobuf.CONTENT_TYPE:
        return protobuf.decode(raw)
    raise errors.unsupported_media_type(ct)


class Request(Protocol):
    """What serving a request reads of it: an aiohttp request, or a ``LocalRequest`` made by a
    component in the API server's own process."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def path_qs(self) -> str: ...

    @property
    def query(self) -> MultiMapping[str]: ...

    @property
    def headers(self) -> MultiMapping[str]: ...

    async def read(self) -> bytes: ...
