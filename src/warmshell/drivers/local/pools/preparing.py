"""Pool images built from a profile's `[setup]`: which image a profile's pool runs, and the builds
that make it.

A profile with `[setup]` runs the image `setup/<profile>:<key>`, where the key is a digest of its
setup (as written, with the content of what it copies) and of its base image's digest: the tag is
how a built image is found again, so a gateway restart reuses it, and a changed step or a base
re-imported under the same name gives another key, so another build. Until that image exists the
profile resolves to a ProfileError whose reason is `Building` (or `BuildFailed`, naming the step
and the end of its output); the pool set shows it on the pool, and a pool of a previous version of
the profile keeps serving meanwhile.

A build is what `warmshell image build` does: the gateway injects it (`gateway/setupbuilds`, a
client of its own public socket, so a build sandbox is created, admitted, limited and deleted like
any other; drivers never see the public API). A failed build is retried with exponential backoff
(`_RETRY_FIRST` doubling to `_RETRY_MAX`), and at once when the profile or its base changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from warmshell.core.backoff import doubling_delay
from warmshell.core.profiles import Profile, ProfileError, Setup
from warmshell.drivers.local.runtime import imageroots

__all__ = ["BUILDING", "BUILD_FAILED", "Build", "BuildError", "Preparer", "content_key", "image_tag"]

_log = logging.getLogger(__name__)

BUILDING = "Building"
BUILD_FAILED = "BuildFailed"
# A step that fails deterministically (a typo) would otherwise hold a build sandbox and a core
# busy for good; one that failed on a passing cause (the network) is not left waiting past 10 min.
_RETRY_FIRST = 5.0
_RETRY_MAX = 600.0

# (profile name, workspace, base, setup, tag) -> None, blocking; BuildError when it failed.
Build = Callable[[str, str, str, Setup, str], None]


class BuildError(Exception):
    """A build failed; the message is what its pool shows (the failing step, its output's end);
    `step` is that step's number (1-based), None when the build failed outside its steps."""

    def __init__(self, message: str, *, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


def content_key(setup: Setup, base_digest: str) -> str:
    """What a built image is for: the setup as given (copies' content included, see
    `reloading`) and the digest its base resolved to."""
    text = json.dumps([dataclasses.asdict(setup), base_digest], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def image_tag(profile_name: str, key: str) -> str:
    """The image store tag a profile's built image has."""
    return f"setup/{profile_name}:{key[:20]}"


@dataclass
class _Attempt:
    key: str
    task: asyncio.Task[None] | None = None
    failures: int = 0
    message: str = ""
    retry_at: float = 0.0
    built: bool = False  # the last build succeeded (so its image must be found now)


class Preparer:
    """Resolves profiles with `[setup]` to their built image, building it when missing."""

    def __init__(
        self,
        *,
        validate: Callable[[Profile], Profile],
        build: Build,
        changed: Callable[[], None],
        retry_first: float = _RETRY_FIRST,
    ) -> None:
        """`validate` is the pool set's (the profile as the driver runs it, its image pinned);
        `build` makes an image (blocking, run in a thread); `changed` is called when a build
        ends or may be retried (the pool set then resolves its profiles again); `retry_first`
        is the first backoff after a failure (doubling up to `_RETRY_MAX`)."""
        self._validate = validate
        self._build = build
        self._changed = changed
        self._retry_first = retry_first
        self._attempts: dict[str, _Attempt] = {}

    def resolve(self, profile: Profile) -> Profile:
        """The profile as its pool runs it: with `[setup]`, its built image (ProfileError with
        reason `Building` or `BuildFailed` while there is none); else `validate`'s."""
        setup = profile.setup
        if setup is None:
            return self._validate(profile)
        try:
            base = self._validate(dataclasses.replace(profile, image=setup.base, setup=None)).image
        except ProfileError as exc:
            key = "setup.from" if exc.key == "image" else exc.key
            raise ProfileError(profile.source, key, exc.rule, reason=exc.reason) from exc
        key = content_key(setup, base)
        try:
            return self._validate(dataclasses.replace(profile, image=image_tag(profile.name, key)))
        except ProfileError as exc:
            if exc.reason != imageroots.NOT_FOUND:
                raise
        return self._pending(profile, base, key)

    def _pending(self, profile: Profile, base: str, key: str) -> Profile:
        attempt = self._attempts.get(profile.name)
        now = asyncio.get_running_loop().time()
        if attempt is None or attempt.key != key:
            if attempt is not None and attempt.task is not None:
                attempt.task.cancel()  # (the thread finishes its build; its image is unused)
            attempt = self._attempts[profile.name] = _Attempt(key)
        if attempt.built:  # built, yet not found: a failure like any other
            attempt.built = False
            self._failed(
                profile.name, attempt, f"image {image_tag(profile.name, key)} was built but is not in the store"
            )
        if attempt.task is None and now >= attempt.retry_at:
            attempt.task = asyncio.create_task(self._run(profile, base, attempt), name=f"setup-{profile.name}")
        if attempt.task is None:
            wait = f"; retrying in {attempt.retry_at - now:.0f}s"
            raise ProfileError(profile.source, "setup", attempt.message + wait, reason=BUILD_FAILED)
        rule = f"building image {image_tag(profile.name, key)} from {profile.setup.base if profile.setup else ''}"
        if attempt.failures:
            rule += f" (attempt {attempt.failures + 1}; the last failed: {attempt.message})"
        raise ProfileError(profile.source, "setup", rule, reason=BUILDING)

    async def _run(self, profile: Profile, base: str, attempt: _Attempt) -> None:
        assert profile.setup is not None
        tag = image_tag(profile.name, attempt.key)
        _log.info("warm pool %s: building image %s", profile.name, tag)
        try:
            await asyncio.to_thread(self._build, profile.name, profile.workspace, base, profile.setup, tag)
        except Exception as exc:  # any failure is the pool's, never the gateway's
            self._failed(
                profile.name, attempt, str(exc) if isinstance(exc, BuildError) else f"{type(exc).__name__}: {exc}"
            )
        else:
            _log.info("warm pool %s: built image %s", profile.name, tag)
            attempt.built = True
        finally:
            attempt.task = None
        self._changed()

    def _failed(self, name: str, attempt: _Attempt, message: str) -> None:
        attempt.failures += 1
        attempt.message = message
        delay = doubling_delay(attempt.failures, first=self._retry_first, cap=_RETRY_MAX)
        loop = asyncio.get_running_loop()
        attempt.retry_at = loop.time() + delay
        loop.call_later(delay, self._changed)
        _log.warning("warm pool %s: building its image failed (retry in %.0fs): %s", name, delay, message)

    def cancel(self) -> None:
        """Stop waiting for builds (the gateway is stopping)."""
        for attempt in self._attempts.values():
            if attempt.task is not None:
                attempt.task.cancel()
