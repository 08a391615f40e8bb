"""Image → local command registry. kubesim has no container engine: an image reference decides which
local program a container runs.

A rule maps an image glob (``fnmatch``) to an *entrypoint* (argv list). The container's argv is
``command + args`` when the pod sets ``command`` (like a container runtime, ``command`` replaces
the image entrypoint) unless the rule says ``overrideCommand``, in which case the rule's entrypoint
always runs, followed by the container's ``args``. With no ``command``, argv is
``entrypoint + args``. An image matching no rule can still run a container that sets ``command``;
without one the container cannot start (``ErrImagePull``).

Callers pass a dict to ``kubesim.cluster.running_cluster(image_map=...)``; ``kubesim serve`` reads a
file named by the ``KUBESIM_IMAGE_MAP`` environment variable (JSON if it ends in ``.json``, else
YAML)::

    {"ghcr.io/warmshell/warmshell:*": {"entrypoint": ["python", "-m", "warmshell", "supervisor"],
                                      "overrideCommand": true,
                                      "programs": {"warmshell": ["python", "-m", "warmshell"],
                                                   "warmshell-agent": ["/path/to/warmshell-agent"]},
                                      "preload": ["warmshell.supervisor.main"]},
     "busybox*": []}
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib.util
import json
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

import yaml


@dataclasses.dataclass(frozen=True)
class ImageRule:
    entrypoint: tuple[str, ...] = ()
    override_command: bool = False
    # Programs the image has on its PATH, as local argv prefixes: a container whose command starts
    # with one (``warmshell gateway start``) runs that prefix instead.
    programs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Modules a fork server imports once: a container running this rule's entrypoint or one of its
    # programs as ``<this python> -m MODULE`` is forked from it (``kubesim.kubelet.forkserver``).
    preload: tuple[str, ...] = ()

    def runs_own_program(self, argv: list[str]) -> bool:
        """Whether ``argv`` starts with the image's entrypoint or one of its ``programs`` (what
        the image runs, as opposed to a command of the pod's own): only those may be forked from
        the image's fork server (a pod's init container ``warmshell install-agent`` as much as
        its ``warmshell supervisor``)."""
        prefixes = [self.entrypoint, *(prefix for _, prefix in self.programs)]
        return any(prefix and list(prefix) == argv[: len(prefix)] for prefix in prefixes)


def _warmshell_agent() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The warmshell image's ``warmshell-agent`` program (its init container: ``--install``): the
    agent built beside the ``warmshell`` package this interpreter would import, found by path,
    not imported; none where there is no such package."""
    spec = importlib.util.find_spec("warmshell")
    if spec is None or spec.origin is None:
        return ()
    agent = pathlib.Path(spec.origin).parent / "drivers" / "local" / "runtime" / "agent" / "warmshell-agent"
    return (("warmshell-agent", (str(agent),)),)


#: Images that behave like a shell toolbox: their commands (``sh -c …``, ``sleep``) run on the host.
DEFAULT_RULES: dict[str, ImageRule] = {
    # The warmshell image's entry point is its supervisor; run it with this interpreter (a command
    # line only: kubesim does not import warmshell). Callers may map the image differently.
    "ghcr.io/warmshell/warmshell:*": ImageRule(
        (sys.executable, "-m", "warmshell", "supervisor"),
        programs=(("warmshell", (sys.executable, "-m", "warmshell")), *_warmshell_agent()),
        # `warmshell install-agent` too (the init container of pods an older gateway rendered).
        preload=("warmshell.supervisor.main", "warmshell.drivers.local.runtime.agent.installing"),
    ),
    "busybox*": ImageRule(("sh",)),
    "docker.io/library/busybox*": ImageRule(("sh",)),
    "alpine*": ImageRule(("sh",)),
    "docker.io/library/alpine*": ImageRule(("sh",)),
    "registry.k8s.io/pause*": ImageRule(("sleep", "infinity")),
}


class ImageNotMapped(Exception):
    """No rule for the image and the container sets no command."""


class ImageMap:
    """Ordered rules; the first matching pattern wins, caller rules before the defaults."""

    def __init__(self, rules: Mapping[str, ImageRule | list[str] | Mapping[str, Any]] | None = None):
        self._rules: list[tuple[str, ImageRule]] = [(pattern, _coerce(rule)) for pattern, rule in (rules or {}).items()]
        self._rules.extend(DEFAULT_RULES.items())

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> ImageMap:
        text = pathlib.Path(path).read_text()
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of image pattern to rule")
        return cls(data)

    def rule_for(self, image: str) -> ImageRule | None:
        for pattern, rule in self._rules:
            if fnmatch.fnmatchcase(image, pattern):
                return rule
        return None

    def argv(self, container: Mapping[str, Any]) -> list[str]:
        """The local argv for a pod container."""
        image = str(container.get("image") or "")
        command = [str(c) for c in container.get("command") or []]
        args = [str(a) for a in container.get("args") or []]
        rule = self.rule_for(image)
        if rule is not None and (rule.override_command or not command):
            argv = [*rule.entrypoint, *args]
            if not argv:
                raise ImageNotMapped(f"image {image!r} has an empty entrypoint and no args")
            return argv
        if command:
            programs = dict(rule.programs) if rule is not None else {}
            if command[0] in programs:
                command = [*programs[command[0]], *command[1:]]
            return command + args
        raise ImageNotMapped(f"no local command for image {image!r} (see kubesim image map)")


def _coerce(rule: ImageRule | list[str] | Mapping[str, Any]) -> ImageRule:
    if isinstance(rule, ImageRule):
        return rule
    if isinstance(rule, list | tuple):
        return ImageRule(tuple(str(x) for x in rule))
    programs = rule.get("programs") or {}
    return ImageRule(
        tuple(str(x) for x in rule.get("entrypoint") or []),
        bool(rule.get("overrideCommand", False)),
        tuple((str(k), tuple(str(x) for x in v)) for k, v in programs.items()),
        tuple(str(x) for x in rule.get("preload") or []),
    )


def runtime_binds(targets: list[str], runtime: list[str] | None = None) -> list[str]:
    """The host paths this Python runs from (its prefixes and import path) that a container's
    volume mounts would hide, outermost first.

    A real image carries its own filesystem, so an ``emptyDir`` at ``/tmp`` hides nothing of the
    program. Here the "image" is this interpreter and its packages: a checkout or virtualenv under
    ``/tmp`` would vanish under the chart's ``/tmp`` volume, so those paths are bound back on top.
    A path equal to, or above, a mount target is left alone (binding it would undo the mount).
    """
    if runtime is None:
        # Every pod of a template asks the same question, and resolving each entry of the import
        # path takes milliseconds per pod start.
        return list(_cached_binds(tuple(targets), (sys.prefix, sys.base_prefix, *sys.path)))
    return _runtime_binds(targets, runtime)


@functools.lru_cache(maxsize=64)
def _cached_binds(targets: tuple[str, ...], roots: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_runtime_binds(list(targets), list(roots)))


def _runtime_binds(targets: list[str], roots: list[str]) -> list[str]:
    hidden: list[pathlib.PurePath] = []
    for entry in roots:
        if not entry or not pathlib.Path(entry).is_dir():
            continue
        path = pathlib.PurePath(pathlib.Path(entry).resolve())
        if any(pathlib.PurePath(t) in path.parents for t in targets):
            hidden.append(path)
    outermost = [p for p in hidden if not any(q in p.parents for q in hidden)]
    return sorted({str(p) for p in outermost}, key=lambda p: (len(pathlib.PurePath(p).parts), p))
