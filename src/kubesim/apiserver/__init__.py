"""The kubesim API server: an aiohttp app that speaks the Kubernetes REST API on loopback.

``ApiServer`` (in ``server``) wires storage, watch, discovery, CRD schemas, patching,
authentication, fault injection and the request log together; ``Authorizer`` is where RBAC plugs in.
"""

from kubesim.apiserver.auth import AllowAll, Attributes, Authorizer, User
from kubesim.apiserver.server import ApiServer, ServerConfig

__all__ = ["AllowAll", "ApiServer", "Attributes", "Authorizer", "ServerConfig", "User"]
