"""warmshell: a control plane for AI-agent sandboxes with warm pools and verified identity.

The SDK (`warmshell.Client`, `warmshell.AsyncClient`, the errors and result types) is loaded on
first attribute access, so `import warmshell` stays cheap for the CLI and the supervisor, which
never pay for grpc or the SDK unless they use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warmshell import sdk as _sdk  # cheap: the package itself loads its names on first use

if TYPE_CHECKING:
    from warmshell.sdk import *  # noqa: F403

__version__ = "0.1.0"

__all__ = sorted(["__version__", *_sdk.__all__])


def __getattr__(name: str) -> Any:
    if name in _sdk.__all__:
        value = getattr(_sdk, name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'warmshell' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
