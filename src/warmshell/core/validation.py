"""Validation of user input: every rule names the field it guards, so errors read
"environment["1X"]: must match [A-Za-z_][A-Za-z0-9_]*" rather than "invalid request"."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from warmshell.core import quantities
from warmshell.core.errors import InvalidArgumentError

__all__ = [
    "MAX_COMMAND_ARGS",
    "MAX_COMMAND_BYTES",
    "MAX_ENV_BYTES",
    "MAX_ENV_VARS",
    "MAX_LABELS",
    "MAX_NAME_LENGTH",
    "MAX_SECRETS",
    "MAX_SECRET_BYTES",
    "MAX_WORKSPACE_LENGTH",
    "RESERVED_ENV_PREFIX",
    "validate_command",
    "validate_environment",
    "validate_environment_patterns",
    "validate_image",
    "validate_labels",
    "validate_name",
    "validate_resources",
    "validate_secrets",
    "validate_storage_size",
    "validate_workspace",
]

# Beyond any machine a sandbox runs on (a typo or an overflow, not a request), and below what a
# process can run in. Each driver also refuses what is over its own configured maximum.
MAX_CPU_MILLIS = 4096 * 1000
MIN_MEMORY_BYTES = 4 * 2**20
MAX_MEMORY_BYTES = 64 * 2**40
# A shell and the command it runs need a few; the kernel's own ceiling (PID_MAX_LIMIT) is 2**22.
MIN_PIDS = 16
MAX_PIDS = 2**22
MIN_STORAGE_BYTES = 2**20

# Object names on Kubernetes are "{workspace}--{name}" and also travel as label values
# (at most 63 characters), so the two limits together stay within one DNS label.
MAX_NAME_LENGTH = 40
MAX_WORKSPACE_LENGTH = 20
MAX_ENV_VARS = 128
MAX_ENV_BYTES = 64 * 1024
MAX_SECRETS = 64
MAX_SECRET_BYTES = 64 * 1024
MAX_ENV_PATTERNS = 32
MAX_COMMAND_ARGS = 256
MAX_COMMAND_BYTES = 128 * 1024
MAX_LABELS = 32
MAX_IMAGE_LENGTH = 512
RESERVED_ENV_PREFIX = "WARMSHELL_"
RESERVED_LABEL_PREFIX = "warmshell.dev/"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_PATTERN = re.compile(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _dns_label(field: str, value: str, limit: int) -> None:
    if not value:
        raise InvalidArgumentError(field, "must not be empty")
    if len(value) > limit:
        raise InvalidArgumentError(field, f"{value[:20]!r}... is {len(value)} characters; at most {limit}")
    if not _DNS_LABEL.match(value):
        raise InvalidArgumentError(
            field,
            f"{value!r} must be a DNS-1123 label: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit",
        )


def validate_name(name: str, *, field: str = "name") -> None:
    """A sandbox name: a DNS-1123 label of at most MAX_NAME_LENGTH characters."""
    _dns_label(field, name, MAX_NAME_LENGTH)


def validate_workspace(workspace: str, *, field: str = "workspace") -> None:
    """A workspace: a DNS-1123 label of at most MAX_WORKSPACE_LENGTH characters."""
    _dns_label(field, workspace, MAX_WORKSPACE_LENGTH)


def validate_environment(
    env: Mapping[str, str],
    *,
    field: str = "environment",
    max_vars: int = MAX_ENV_VARS,
    max_bytes: int = MAX_ENV_BYTES,
) -> None:
    """Environment names are POSIX-style identifiers; WARMSHELL_* is reserved for the system.
    Errors never quote a value (secrets are checked by the same rules)."""
    if len(env) > max_vars:
        raise InvalidArgumentError(field, f"{len(env)} variables; at most {max_vars}")
    total = 0
    for key, value in env.items():
        if not _ENV_NAME.match(key):
            raise InvalidArgumentError(f"{field}[{key!r}]", "name must match [A-Za-z_][A-Za-z0-9_]*")
        if key.upper().startswith(RESERVED_ENV_PREFIX):
            raise InvalidArgumentError(f"{field}[{key!r}]", f"names starting with {RESERVED_ENV_PREFIX} are reserved")
        if "\x00" in value:
            raise InvalidArgumentError(f"{field}[{key!r}]", "value must not contain NUL")
        total += len(key) + len(value.encode())
    if total > max_bytes:
        raise InvalidArgumentError(field, f"{total} bytes in total; at most {max_bytes}")


def validate_secrets(secrets: Mapping[str, str], environment: Mapping[str, str], *, field: str = "secrets") -> None:
    """Secrets follow the environment's name rules, have their own bounds, and never share a name
    with a plain environment variable (which of the two the workload would see is not obvious)."""
    validate_environment(secrets, field=field, max_vars=MAX_SECRETS, max_bytes=MAX_SECRET_BYTES)
    for key in secrets:
        if key in environment:
            raise InvalidArgumentError(
                f"{field}[{key!r}]", "is also set in spec.environment; a name is one or the other"
            )


def validate_environment_patterns(patterns: Sequence[str], *, field: str = "environment") -> None:
    """Accepted-environment patterns: variable names where `*` and `?` are shell-style wildcards."""
    if len(patterns) > MAX_ENV_PATTERNS:
        raise InvalidArgumentError(field, f"{len(patterns)} patterns; at most {MAX_ENV_PATTERNS}")
    for index, pattern in enumerate(patterns):
        if not _ENV_PATTERN.match(pattern):
            raise InvalidArgumentError(
                f"{field}[{index}]", f"{pattern!r} must be a variable name, with * and ? as wildcards"
            )
        if pattern.upper().startswith(RESERVED_ENV_PREFIX):
            raise InvalidArgumentError(f"{field}[{index}]", f"names starting with {RESERVED_ENV_PREFIX} are reserved")


def validate_command(command: Sequence[str], *, field: str = "command") -> None:
    """An argv: bounded in count and size, no NUL bytes, a non-empty program name."""
    if len(command) > MAX_COMMAND_ARGS:
        raise InvalidArgumentError(field, f"{len(command)} arguments; at most {MAX_COMMAND_ARGS}")
    if command and not command[0]:
        raise InvalidArgumentError(f"{field}[0]", "the program must not be empty")
    total = 0
    for index, arg in enumerate(command):
        if "\x00" in arg:
            raise InvalidArgumentError(f"{field}[{index}]", "must not contain NUL")
        total += len(arg.encode())
    if total > MAX_COMMAND_BYTES:
        raise InvalidArgumentError(field, f"{total} bytes in total; at most {MAX_COMMAND_BYTES}")


def validate_labels(labels: Mapping[str, str], *, field: str = "labels") -> None:
    """Kubernetes label syntax ([prefix/]name=value, 63-character parts); warmshell.dev/ is reserved."""
    if len(labels) > MAX_LABELS:
        raise InvalidArgumentError(field, f"{len(labels)} labels; at most {MAX_LABELS}")
    for key, value in labels.items():
        where = f"{field}[{key!r}]"
        prefix, _, name = key.rpartition("/")
        if key.startswith(RESERVED_LABEL_PREFIX):
            raise InvalidArgumentError(where, f"the {RESERVED_LABEL_PREFIX} prefix is reserved")
        if prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
            raise InvalidArgumentError(where, "prefix must be a DNS-1123 subdomain")
        if not name or len(name) > 63 or not _LABEL_NAME.match(name):
            raise InvalidArgumentError(
                where,
                "name must be 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric",
            )
        if len(value) > 63 or not _LABEL_NAME.match(value):
            raise InvalidArgumentError(
                where,
                "value must be at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric",
            )


def validate_image(image: str, *, field: str = "image") -> None:
    """Driver-neutral checks of an image reference; drivers add their own meaning."""
    if len(image) > MAX_IMAGE_LENGTH:
        raise InvalidArgumentError(field, f"{len(image)} characters; at most {MAX_IMAGE_LENGTH}")
    if _CONTROL.search(image) or any(ch.isspace() for ch in image):
        raise InvalidArgumentError(field, "must not contain whitespace or control characters")


def validate_resources(
    cpu_millis: int,
    memory_bytes: int,
    pids: int = 0,
    *,
    typed: tuple[str, str] = ("", ""),
    field: str = "spec.resources",
) -> None:
    """Requested amounts (0 = none) are within what any sandbox can mean: at most 4096 cpus, 4Mi
    to 64Ti of memory, 16 to 2**22 processes. Errors quote the cpu and memory as `typed` (what the
    user wrote), else in their normal form."""
    if pids and not MIN_PIDS <= pids <= MAX_PIDS:
        rule = f"{pids} must be between {MIN_PIDS} and {MAX_PIDS} (or 0: the default)"
        raise InvalidArgumentError(f"{field}.pids", rule)
    cpu, memory = typed[0] or quantities.render_cpu(cpu_millis), typed[1] or quantities.render_memory(memory_bytes)
    if cpu_millis > MAX_CPU_MILLIS:
        raise InvalidArgumentError(f"{field}.cpu", f"{cpu!r} is more than {MAX_CPU_MILLIS // 1000} cpus")
    if memory_bytes and memory_bytes < MIN_MEMORY_BYTES:
        raise InvalidArgumentError(f"{field}.memory", f"{memory!r} is less than 4Mi (no process runs in that)")
    if memory_bytes > MAX_MEMORY_BYTES:
        raise InvalidArgumentError(f"{field}.memory", f"{memory!r} is more than 64Ti")


def validate_storage_size(size: str, *, field: str) -> None:
    """A storage size (normal form, "" = the default) is 1Mi to 64Ti."""
    if size:
        amount = quantities.memory_bytes(size, field=field)
        if amount < MIN_STORAGE_BYTES:
            raise InvalidArgumentError(field, f"{size!r} is less than 1Mi")
        if amount > MAX_MEMORY_BYTES:
            raise InvalidArgumentError(field, f"{size!r} is more than 64Ti")
