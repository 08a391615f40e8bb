"""The public surface of `warmshell`: pinned, and loaded lazily so `import warmshell` stays cheap."""

from __future__ import annotations

import subprocess
import sys

import warmshell
from warmshell import sdk


def test_every_public_name_resolves_to_the_sdk_object() -> None:
    # The list itself is pinned in tests/unit/test_generated_stubs.py.
    assert warmshell.__all__ == sorted(["__version__", *sdk.__all__])
    for name in sdk.__all__:
        assert getattr(warmshell, name) is getattr(sdk, name)
    assert "Client" in dir(warmshell)


def test_import_warmshell_loads_neither_grpc_nor_the_sdk() -> None:
    probe = (
        "import sys, warmshell; "
        "assert 'grpc' not in sys.modules and 'warmshell.sdk.client' not in sys.modules, sorted(sys.modules); "
        "warmshell.Client; "
        "assert 'warmshell.sdk.client' in sys.modules and 'grpc' not in sys.modules; "
        "warmshell.Client(address='unix:///nowhere', token='t').close(); "
        "assert 'grpc' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60, env={"PATH": "/usr/bin:/bin"})


def test_a_client_on_the_http2_transport_never_loads_grpc() -> None:
    probe = (
        "import sys, warmshell; "
        "warmshell.Client(address='unix:///nowhere', token='t', transport='http2').close(); "
        "assert 'grpc' not in sys.modules and 'asyncio' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60, env={"PATH": "/usr/bin:/bin"})


def test_the_connection_helpers_load_without_grpc() -> None:
    probe = "import sys, warmshell.sdk.connection; assert 'grpc' not in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
