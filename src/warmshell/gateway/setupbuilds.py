"""How the local driver builds a profile's `[setup]` image: `warmshell image build` (the SDK's
`building`) over this gateway's own public socket, as the holder of its API token, so a build
sandbox is created, admitted and deleted like any client's."""

from __future__ import annotations

from pathlib import Path

from warmshell.core.profiles import Setup
from warmshell.drivers.local.pools.preparing import Build, BuildError
from warmshell.sdk import building, errors
from warmshell.sdk.client import Client

__all__ = ["client_build"]

# The end of a failed step's output a pool shows (its status is listed often; the step names it).
_TAIL_CHARS = 1000


def client_build(state_dir: Path) -> Build:
    """A blocking build of `setup` from `base` as `tag`, in `workspace`, through the gateway whose
    state directory is `state_dir`; BuildError naming the failing step."""

    def run(workspace: str, base: str, setup: Setup, tag: str) -> None:
        steps: list[building.Step] = [building.Copy(Path(local), path) for local, path in setup.copies]
        steps += [building.Run(command) for command in setup.runs]
        try:
            with Client(state_dir=state_dir, workspace=workspace) as client:
                client.build_image(tag, base=base, steps=steps, allow_net=setup.allow_net, force=True)
        except building.BuildFailed as exc:
            tail = exc.tail.decode(errors="replace").strip()[-_TAIL_CHARS:]
            raise BuildError(f"{exc}; output ends: {tail!r}" if tail else str(exc)) from exc
        except errors.Error as exc:
            raise BuildError(str(exc)) from exc

    return run
