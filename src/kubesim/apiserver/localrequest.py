"""A request made by a component in the API server's own process (kubesim's controllers and
kubelet): served by the same handler as an HTTP request (authentication, authorisation, injected
faults, the verb, the request log), without a socket, HTTP parsing or TLS in between."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlencode

from multidict import CIMultiDict, MultiDict

from kubesim.apiserver.store import Bucket
from kubesim.apiserver.watch import ObjectWatcher


@dataclasses.dataclass
class OpenedWatch:
    """A watch the handler opened for a local request: its watcher is subscribed to ``bucket``
    (the consumer unsubscribes it when done) and ends after ``duration`` seconds."""

    watcher: ObjectWatcher
    bucket: Bucket
    duration: float


@dataclasses.dataclass
class LocalRequest:
    """One request, in the shape ``handlers_common.Request`` describes."""

    method: str
    path: str
    query: MultiDict[str]
    headers: CIMultiDict[str]
    body: bytes = b""
    #: Set by the watch verb: a local watch is consumed as objects, not streamed.
    opened: OpenedWatch | None = None
    #: The body as an object (a private copy the server may keep and edit), instead of ``body``.
    payload: Any = None
    #: Set by a verb that succeeds: the answer as an object of the caller's own, instead of JSON.
    answer: Any = None
    #: The caller only reads the answer: a write may answer with the stored object itself
    #: (read-only, as the objects of a watch are) instead of a copy decoded for the caller.
    read_only_answer: bool = False

    @property
    def path_qs(self) -> str:
        return self.path + ("?" + urlencode(list(self.query.items())) if self.query else "")

    async def read(self) -> bytes:
        return self.body
