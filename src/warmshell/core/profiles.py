"""Warm-pool profiles: the strict parser for `warm-pool.toml`, the same format on every driver.

```
version = 1
workspace = "default"
replicas = 2
image = ""                 # "" = the driver's default image
runtime_class_name = ""    # optional
[environment]
FOO = "bar"
[resources]
cpu = "0.2"
memory = "256Mi"
pids = 256                 # optional: most processes at once
[storage]                  # optional: sizes of the writable places ("" = the gateway's default)
workspace = "2Gi"          # /workspace
tmp = "512Mi"              # /tmp
[activation]
environment = ["TASK_ID", "RUN_*"]   # keys a request may set at activation; default none
secret_hosts = { API_KEY = ["api.example.com"] }   # a request's secret API_KEY: a placeholder
[lifetime]                 # optional: defaults for sandboxes this pool serves (0 = no limit)
ttl_seconds = 600
idle_timeout_seconds = 120
[network]                  # optional: egress of the sandboxes it serves (see core/egress)
allow = ["pypi.example:443", "*.githubusercontent.example:443"]   # replaces the gateway's default
deny = ["internal.pypi.example"]
[setup]                    # optional: the pool's image is built from `from` by these steps
from = "python:3.12"       # the base image (the profile's `image` must then be unset)
copy = ["src:/workspace/src"]            # LOCAL:PATH, LOCAL relative to the profile's directory
run = ["pip install -r /workspace/src/requirements.txt"]   # /bin/sh -c each, after the copies
allow_net = ["pypi.org"]   # what the build sandbox may reach
```

`[setup]` is part of the pool: changing it builds a new image and replaces the members.

`[network]` is applied at activation, outside the sandbox: like `[lifetime]` it is not part of
the shape, and changing it keeps the members. So is `[activation] secret_hosts`: a secret of that
name in a request that names no hosts for it reaches the workload as a placeholder, swapped for
those hosts only (`core/egress.parse_secret_host`); hosts the request names for it replace them.

An accepted key is left out of a request's match with this pool and set when a member is
activated; it can therefore not be baked into `[environment]` too. The pattern set is part of the
pool's shape (its fingerprint), so changing it replaces the pool.

A profile's name is its file's stem. Every error names the file, the key and the rule, with the
line number when it can be found (tomllib reports it for syntax errors; for the others we find the
key's line ourselves). Pure: callers read the file and pass its text.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from warmshell.core import egress
from warmshell.core.apiranges import MAX_LIFETIME_SECONDS
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.fingerprints import SandboxShape, fingerprint, matches_any, pattern_set
from warmshell.core.ids import Fingerprint
from warmshell.core.models import Resources, Storage
from warmshell.core.quantities import normalize_cpu, normalize_memory
from warmshell.core.validation import (
    MAX_PIDS,
    MIN_PIDS,
    validate_environment,
    validate_environment_patterns,
    validate_image,
    validate_name,
    validate_storage_size,
    validate_workspace,
)

__all__ = [
    "COPY_RULE",
    "MAX_LIFETIME_SECONDS",
    "PROFILE_VERSION",
    "Profile",
    "ProfileError",
    "Setup",
    "parse_profile",
    "split_copy",
]

PROFILE_VERSION = 1
_TOP_LEVEL = (
    "version",
    "workspace",
    "replicas",
    "image",
    "runtime_class_name",
    "environment",
    "resources",
    "storage",
    "activation",
    "lifetime",
    "network",
    "setup",
)
_SETUP = ("from", "run", "copy", "allow_net")
_ACTIVATION = ("environment", "secret_hosts")
_SECRET_HOSTS = "activation.secret_hosts"
_RESOURCES = ("cpu", "memory", "pids")
_STORAGE = ("workspace", "tmp", "root")
_LIFETIME = ("ttl_seconds", "idle_timeout_seconds")
_NETWORK = ("allow", "deny")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TOML_LINE = re.compile(r"at line (\d+)")
_HEADER = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]")


class ProfileError(InvalidArgumentError):
    """A profile broke a rule: `<file>:<line>: <key>: <rule>` (no line when unknown)."""

    def __init__(self, source: str, key: str, rule: str, line: int | None = None, *, reason: str = "") -> None:
        """`reason`: what a pool of this profile reports (empty: `InvalidProfile`)."""
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {key}", rule)
        self.source = source
        self.key = key
        self.line = line
        self.reason = reason or "InvalidProfile"


@dataclass(frozen=True)
class Setup:
    """A profile's `[setup]`: its pool's image is `base` after the `copies` (LOCAL, PATH; LOCAL as
    written, relative to the profile's directory) and then the `runs`, in a build sandbox that may
    reach `allow_net`."""

    base: str
    runs: tuple[str, ...]
    copies: tuple[tuple[str, str], ...] = ()
    allow_net: tuple[str, ...] = ()
    # A digest of what the copies copy (set by whoever reads their sources), so a changed file
    # is a changed setup.
    copied: str = ""


@dataclass(frozen=True)
class Profile:
    """A parsed, validated profile; quantities are in normal form."""

    name: str
    source: str
    workspace: str
    replicas: int
    image: str = ""
    runtime_class_name: str = ""
    environment: Mapping[str, str] = field(default_factory=dict)
    cpu: str = ""
    memory: str = ""
    pids: int = 0
    # `[storage]`: not part of the shape (a request cannot ask for it), but of the pool.
    storage: Storage = field(default_factory=Storage)
    # `[activation] environment`, as a `fingerprints.pattern_set`.
    accepted_environment: tuple[str, ...] = ()
    # Lifetime defaults for the sandboxes this pool serves (None: the gateway's); not part of
    # the shape, so they never split or move a pool.
    ttl_seconds: int | None = None
    idle_timeout_seconds: int | None = None
    # `[network]` rules as written (each checked by `egress.parse_rule`); allow None: the
    # gateway's default. Not part of the shape either.
    network_allow: tuple[str, ...] | None = None
    network_deny: tuple[str, ...] = ()
    # `[activation] secret_hosts`: secret name -> its hosts as written. Not part of the shape.
    secret_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # `[setup]`: how the pool's image is built (None: `image` is used as it is).
    setup: Setup | None = None

    @functools.cached_property
    def resources(self) -> Resources:
        """`cpu`, `memory` and `pids` as the core model carries them (amounts), read once."""
        return Resources.model_validate({"cpu": self.cpu, "memory": self.memory, "pids": self.pids})

    def shape(self, default_image: str) -> SandboxShape:
        """The sandbox shape this pool serves, with the driver's default image resolved."""
        return SandboxShape(
            workspace=self.workspace,
            image=self.image or default_image,
            environment=dict(self.environment),
            cpu_millis=self.resources.cpu_millis,
            memory_bytes=self.resources.memory_bytes,
            pids=self.pids,
            runtime_class_name=self.runtime_class_name,
            accepted=self.accepted_environment,
        )

    def fingerprint(self, default_image: str) -> Fingerprint:
        """The fingerprint a create request must have to be served by this pool."""
        return fingerprint(self.shape(default_image))

    def same_pool(self, other: Profile) -> bool:
        """Whether `other` differs at most in replicas (so idle members can stay)."""
        return _without_replicas(self) == _without_replicas(other)


def _without_replicas(profile: Profile) -> tuple[object, ...]:
    return (
        profile.workspace,
        profile.image,
        profile.runtime_class_name,
        tuple(sorted(profile.environment.items())),
        profile.cpu,
        profile.memory,
        profile.pids,
        profile.storage,
        profile.accepted_environment,
        profile.setup,
    )


def _line_of(text: str, key: str, table: str | None = None) -> int | None:
    """The 1-based line where `key` is assigned (in `[table]` when given), if we can find it."""
    assignment = re.compile(rf"""^\s*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')\s*=""")
    current: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            continue
        if current == table and assignment.match(line):
            return number
    return None


class _Parser:
    def __init__(self, text: str, source: str, max_replicas: int) -> None:
        self.text = text
        self.source = source
        self.max_replicas = max_replicas

    def fail(self, key: str, rule: str, table: str | None = None) -> ProfileError:
        leaf = key[len(table) + 1 :] if table else key
        return ProfileError(self.source, key, rule, _line_of(self.text, leaf, table))

    def parse(self, name: str) -> Profile:
        try:
            data = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            found = _TOML_LINE.search(str(exc))
            line = int(found.group(1)) if found else None
            raise ProfileError(self.source, "(syntax)", f"not valid TOML: {exc}", line) from exc
        try:
            validate_name(name, field="name")
        except InvalidArgumentError as exc:
            raise ProfileError(self.source, "(file name)", f"the profile name {exc.rule}") from exc
        for key in data:
            if key not in _TOP_LEVEL:
                raise self.fail(key, f"unknown key; allowed: {', '.join(_TOP_LEVEL)}")
        self.check_version(data)
        environment = self.environment(data)
        ttl, idle = self.lifetime(data)
        allow, deny = self.network(data)
        return Profile(
            name=name,
            source=self.source,
            workspace=self.workspace(data),
            replicas=self.replicas(data),
            image=self.image(data),
            runtime_class_name=self.runtime_class(data),
            environment=environment,
            accepted_environment=self.activation(data, environment),
            **self.resources(data),
            pids=self.pids(data),
            storage=self.storage(data),
            ttl_seconds=ttl,
            idle_timeout_seconds=idle,
            network_allow=allow,
            network_deny=deny,
            secret_hosts=self.secret_hosts(data),
            setup=self.setup(data),
        )

    def check_version(self, data: Mapping[str, Any]) -> None:
        version = data.get("version")
        if version is None:
            raise ProfileError(self.source, "version", f"is required (version = {PROFILE_VERSION})")
        if type(version) is not int or version != PROFILE_VERSION:
            raise self.fail("version", f"must be {PROFILE_VERSION}, not {version!r}")

    def workspace(self, data: Mapping[str, Any]) -> str:
        value = data.get("workspace")
        if value is None:
            raise ProfileError(self.source, "workspace", "is required")
        if not isinstance(value, str):
            raise self.fail("workspace", "must be a string")
        try:
            validate_workspace(value)
        except InvalidArgumentError as exc:
            raise self.fail("workspace", exc.rule) from exc
        return value

    def replicas(self, data: Mapping[str, Any]) -> int:
        value = data.get("replicas")
        if value is None:
            raise ProfileError(self.source, "replicas", "is required")
        if type(value) is not int:
            raise self.fail("replicas", "must be an integer")
        if not 1 <= value <= self.max_replicas:
            raise self.fail("replicas", f"must be between 1 and {self.max_replicas}, not {value}")
        return value

    def image(self, data: Mapping[str, Any]) -> str:
        value = data.get("image", "")
        if not isinstance(value, str):
            raise self.fail("image", "must be a string")
        try:
            validate_image(value)
        except InvalidArgumentError as exc:
            raise self.fail("image", exc.rule) from exc
        return value

    def runtime_class(self, data: Mapping[str, Any]) -> str:
        value = data.get("runtime_class_name", "")
        if not isinstance(value, str):
            raise self.fail("runtime_class_name", "must be a string")
        if value and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
            raise self.fail("runtime_class_name", "must be a DNS-1123 subdomain")
        return value

    def environment(self, data: Mapping[str, Any]) -> dict[str, str]:
        table = data.get("environment", {})
        if not isinstance(table, dict):
            raise self.fail("environment", "must be a table ([environment])")
        for key, value in table.items():
            if not isinstance(value, str):
                raise self.fail(f"environment.{key}", "must be a string", table="environment")
            try:
                validate_environment({key: value})
            except InvalidArgumentError as exc:
                raise self.fail(f"environment.{key}", exc.rule, table="environment") from exc
        try:
            validate_environment(table)
        except InvalidArgumentError as exc:
            raise self.fail("environment", exc.rule) from exc
        return dict(table)

    def activation(self, data: Mapping[str, Any], baked: Mapping[str, str]) -> tuple[str, ...]:
        table = data.get("activation", {})
        if not isinstance(table, dict):
            raise self.fail("activation", "must be a table ([activation])")
        for key in table:
            if key not in _ACTIVATION:
                allowed = ", ".join(_ACTIVATION)
                raise self.fail(f"activation.{key}", f"unknown key; allowed: {allowed}", table="activation")
        patterns = table.get("environment", [])
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise self.fail("activation.environment", "must be a list of strings", table="activation")
        try:
            validate_environment_patterns(patterns, field="activation.environment")
        except InvalidArgumentError as exc:
            line = _line_of(self.text, "environment", "activation")
            raise ProfileError(self.source, exc.field, exc.rule, line) from exc
        for key in baked:
            if matches_any(key, patterns):
                raise self.fail(
                    f"environment.{key}",
                    "is also accepted by [activation] environment; a key is either baked or accepted",
                    table="environment",
                )
        return pattern_set(patterns)

    def secret_hosts(self, data: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
        table = data.get("activation", {}).get("secret_hosts", {})
        line = _line_of(self.text, "secret_hosts", "activation")
        if not isinstance(table, dict):
            raise ProfileError(self.source, _SECRET_HOSTS, "must be a table of secret name -> list of hosts", line)
        hosts: dict[str, tuple[str, ...]] = {}
        for name, rules in table.items():
            if not isinstance(rules, list) or not rules or not all(isinstance(rule, str) for rule in rules):
                raise ProfileError(self.source, f"{_SECRET_HOSTS}.{name}", "must be a non-empty list of hosts", line)
            try:
                validate_environment({name: ""}, field=_SECRET_HOSTS)
                for index, rule in enumerate(rules):
                    egress.parse_secret_host(rule, field=f"{_SECRET_HOSTS}.{name}[{index}]")
            except InvalidArgumentError as exc:
                raise ProfileError(self.source, exc.field, exc.rule, line) from None
            hosts[name] = tuple(rule.strip() for rule in rules)
        return hosts

    def resources(self, data: Mapping[str, Any]) -> dict[str, str]:
        table = data.get("resources", {})
        if not isinstance(table, dict):
            raise self.fail("resources", "must be a table ([resources])")
        for key in table:
            if key not in _RESOURCES:
                raise self.fail(f"resources.{key}", "unknown key; allowed: cpu, memory, pids", table="resources")
        normal: dict[str, str] = {}
        for key, normalize in (("cpu", normalize_cpu), ("memory", normalize_memory)):
            value = table.get(key, "")
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise self.fail(f"resources.{key}", "must be a quantity string", table="resources")
            try:
                normal[key] = normalize(str(value), field=f"resources.{key}")
            except InvalidArgumentError as exc:
                raise self.fail(f"resources.{key}", exc.rule, table="resources") from exc
        return normal

    def pids(self, data: Mapping[str, Any]) -> int:
        table = data.get("resources", {})
        value = table.get("pids", 0)
        if type(value) is not int or not (value == 0 or MIN_PIDS <= value <= MAX_PIDS):
            rule = f"must be a whole number between {MIN_PIDS} and {MAX_PIDS} (or 0: the gateway's default)"
            raise self.fail("resources.pids", rule, table="resources")
        return value

    def storage(self, data: Mapping[str, Any]) -> Storage:
        table = data.get("storage", {})
        if not isinstance(table, dict):
            raise self.fail("storage", "must be a table ([storage])")
        sizes: dict[str, str] = {}
        for key, value in table.items():
            if key not in _STORAGE:
                raise self.fail(f"storage.{key}", f"unknown key; allowed: {', '.join(_STORAGE)}", table="storage")
            if not isinstance(value, str):
                raise self.fail(f"storage.{key}", 'must be a size string (e.g. "2Gi")', table="storage")
            try:
                sizes[key] = normalize_memory(value, field=f"storage.{key}")
                validate_storage_size(sizes[key], field=f"storage.{key}")
            except InvalidArgumentError as exc:
                raise self.fail(f"storage.{key}", exc.rule, table="storage") from exc
        return Storage.model_validate(sizes)

    def lifetime(self, data: Mapping[str, Any]) -> tuple[int | None, int | None]:
        table = data.get("lifetime", {})
        if not isinstance(table, dict):
            raise self.fail("lifetime", "must be a table ([lifetime])")
        for key, value in table.items():
            if key not in _LIFETIME:
                raise self.fail(f"lifetime.{key}", f"unknown key; allowed: {', '.join(_LIFETIME)}", table="lifetime")
            if type(value) is not int or value < 0:
                raise self.fail(f"lifetime.{key}", "must be a whole number of seconds (0 = no limit)", table="lifetime")
            if value > MAX_LIFETIME_SECONDS:
                rule = f"{value} is more than {MAX_LIFETIME_SECONDS} s, the most the API carries (0 = no limit)"
                raise self.fail(f"lifetime.{key}", rule, table="lifetime")
        return table.get("ttl_seconds"), table.get("idle_timeout_seconds")

    def network(self, data: Mapping[str, Any]) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
        table = data.get("network", {})
        if not isinstance(table, dict):
            raise self.fail("network", "must be a table ([network])")
        for key in table:
            if key not in _NETWORK:
                raise self.fail(f"network.{key}", f"unknown key; allowed: {', '.join(_NETWORK)}", table="network")
        lists: list[tuple[str, ...]] = []
        for key in _NETWORK:
            rules = table.get(key, [])
            if not isinstance(rules, list) or not all(isinstance(rule, str) for rule in rules):
                raise self.fail(f"network.{key}", "must be a list of strings", table="network")
            try:
                egress.parse_rules(rules, field=f"network.{key}")
            except InvalidArgumentError as exc:
                raise ProfileError(self.source, exc.field, exc.rule, _line_of(self.text, key, "network")) from None
            lists.append(tuple(rule.strip() for rule in rules))
        return (lists[0] if "allow" in table else None), lists[1]

    def setup(self, data: Mapping[str, Any]) -> Setup | None:
        table = data.get("setup")
        if table is None:
            return None
        if not isinstance(table, dict):
            raise self.fail("setup", "must be a table ([setup])")
        for key in table:
            if key not in _SETUP:
                raise self.fail(f"setup.{key}", f"unknown key; allowed: {', '.join(_SETUP)}", table="setup")
        if data.get("image"):
            raise self.fail("image", "must be unset with [setup]: the pool's image is the one built from setup.from")
        base = table.get("from")
        if not isinstance(base, str) or not base:
            raise self.fail("setup.from", "is required: the base image the steps run in", table="setup")
        lists = {key: self.strings(table, key) for key in ("run", "copy", "allow_net")}
        if not lists["run"]:
            raise self.fail("setup.run", "must be a non-empty list of commands", table="setup")
        copies = []
        for text in lists["copy"]:
            copy = split_copy(text)
            if copy is None:
                raise self.fail("setup.copy", f"{text!r} {COPY_RULE}", table="setup")
            copies.append(copy)
        try:
            validate_image(base, field="setup.from")
            egress.parse_rules(list(lists["allow_net"]), field="setup.allow_net")
        except InvalidArgumentError as exc:
            raise ProfileError(self.source, exc.field, exc.rule, _line_of(self.text, exc.field[6:], "setup")) from None
        return Setup(base, lists["run"], tuple(copies), lists["allow_net"])

    def strings(self, table: Mapping[str, Any], key: str) -> tuple[str, ...]:
        values = table.get(key, [])
        if not isinstance(values, list) or not all(isinstance(v, str) and v.strip() for v in values):
            raise self.fail(f"setup.{key}", "must be a list of non-empty strings", table="setup")
        return tuple(values)


COPY_RULE = "must be LOCAL:PATH with an absolute PATH in the sandbox"


def split_copy(text: str) -> tuple[str, str] | None:
    """A copy step's `LOCAL:PATH` as (LOCAL, PATH), the last ':' splitting them (a local path
    may hold one); None unless both are there and PATH is absolute (see `COPY_RULE`)."""
    local, sep, path = text.rpartition(":")
    return (local, path) if sep and local and path.startswith("/") else None


def parse_profile(text: str, *, name: str, source: str, max_replicas: int) -> Profile:
    """Parse and validate one profile; raises ProfileError naming file, key and rule."""
    return _Parser(text, source, max_replicas).parse(name)
