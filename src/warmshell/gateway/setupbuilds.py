"""How the local driver builds a profile's `[setup]` image: `warmshell image build` (the SDK's
`building`) over this gateway's own public socket, as the holder of its API token, so a build
sandbox is created, admitted and deleted like any client's. Each build is counted on /metrics
(`measured`): started, succeeded, failed with its step, and its duration."""

from __future__ import annotations

import time
from pathlib import Path

from warmshell.core.profiles import Setup
from warmshell.drivers.local.pools.preparing import Build, BuildError
from warmshell.gateway import metrics
from warmshell.sdk import building, errors
from warmshell.sdk.client import Client

__all__ = ["BUILD_LABEL", "client_build", "measured"]

# (warmshell.dev/ is reserved to the gateway's own labels, which a client cannot set.)
BUILD_LABEL = "warmshell-setup-build"

# The end of a failed step's output a pool shows (its status is listed often; the step names it).
_TAIL_CHARS = 1000


def client_build(state_dir: Path) -> Build:
    """A blocking build of profile `profile`'s `setup` from `base` as `tag`, in `workspace`,
    through the gateway whose state directory is `state_dir`; BuildError naming the failing step.
    Its sandbox is labelled `BUILD_LABEL=<profile>`."""

    def run(profile: str, workspace: str, base: str, setup: Setup, tag: str) -> None:
        steps: list[building.Step] = [building.Copy(Path(local), path) for local, path in setup.copies]
        steps += [building.Run(command) for command in setup.runs]
        # The profile's name: a build sandbox a stopped gateway left behind is deleted by the next.
        labels = {BUILD_LABEL: profile}
        try:
            with Client(state_dir=state_dir, workspace=workspace) as client:
                for left in client.list(labels=labels):
                    client.get(left.name).delete()
                client.build_image(tag, base=base, steps=steps, allow_net=setup.allow_net, force=True, labels=labels)
        except building.BuildFailed as exc:
            tail = exc.tail.decode(errors="replace").strip()[-_TAIL_CHARS:]
            raise BuildError(f"{exc}; output ends: {tail!r}" if tail else str(exc), step=exc.step) from exc
        except errors.Error as exc:
            raise BuildError(str(exc)) from exc

    return measured(run)


def measured(build: Build) -> Build:
    """`build`, each call counted in `metrics.SETUP_BUILDS` (started, then succeeded or failed
    with the failing step) and timed in `metrics.SETUP_BUILD_SECONDS`."""

    def run(profile: str, workspace: str, base: str, setup: Setup, tag: str) -> None:
        metrics.SETUP_BUILDS.labels(profile, "started", "").inc()
        started = time.monotonic()
        try:
            build(profile, workspace, base, setup, tag)
        except BaseException as exc:
            step = exc.step if isinstance(exc, BuildError) else None
            metrics.SETUP_BUILDS.labels(profile, "failed", "" if step is None else str(step)).inc()
            metrics.SETUP_BUILD_SECONDS.labels(profile, "failed").observe(time.monotonic() - started)
            raise
        metrics.SETUP_BUILDS.labels(profile, "succeeded", "").inc()
        metrics.SETUP_BUILD_SECONDS.labels(profile, "succeeded").observe(time.monotonic() - started)

    return run
