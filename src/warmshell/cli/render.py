"""Rendering of gateway messages for people (aligned plain-text tables and lines) and for scripts
(JSON). The views are pure functions returning text, so each is unit-tested as a string.

Plain text rather than a rich console: a table is a few lines of alignment, and importing a
terminal toolkit cost more than the rest of a `sandbox list`. protobuf's JSON support is imported
only by the JSON path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

# Loaded with the generated messages every command imports anyway (json_format is not).
from google.protobuf.descriptor import FieldDescriptor

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from warmshell.api.v1 import sandbox_pb2

__all__ = [
    "TIMELINE_STEPS",
    "clock",
    "condition_lines",
    "create_summary",
    "egress_table",
    "expiry_text",
    "format_age",
    "format_bytes",
    "format_ms",
    "hit_rate",
    "phase_label",
    "phase_line",
    "phase_name",
    "pools_view",
    "progress_line",
    "sandbox_details",
    "sandbox_table",
    "table",
    "time_to_ready_ms",
    "timeline_offsets",
    "to_dict",
    "to_json",
]

# Values of warmshell.v1.SandboxPhase; spelled out so rendering needs no generated module.
_PHASES = {0: "Unknown", 1: "Provisioning", 2: "Ready", 3: "Error", 4: "Deleting", 5: "Exited", 6: "Paused"}
_EXITED = 5
_NONE = "-"

# (label, Timeline field) in the order a sandbox reaches them.
TIMELINE_STEPS: tuple[tuple[str, str], ...] = (
    ("backend created", "backend_created_us"),
    ("claimed", "claimed_us"),
    ("registered", "registered_us"),
    ("activated", "activated_us"),
    ("ready", "ready_us"),
    ("exited", "exited_us"),
)


def _with_every_submessage(message: Message) -> Message:
    """A copy with every singular sub-message present (a oneof keeps its one member), so that
    an unset `spec` or `timeline` still shows up as an object of defaults."""
    filled = type(message)()
    filled.CopyFrom(message)
    _fill(filled)
    return filled


def _fill(message: Message) -> None:
    for field in message.DESCRIPTOR.fields:
        # Filling a oneof member would change which member is set; maps of messages we have none.
        if field.message_type is None or field.containing_oneof is not None:
            continue
        if field.message_type.GetOptions().map_entry:
            continue
        if field.is_repeated:
            for item in getattr(message, field.name):  # each pool, condition... has every field too
                _fill(item)
            continue
        child = getattr(message, field.name)
        child.SetInParent()
        _fill(child)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, right: frozenset[int] = frozenset()) -> str:
    """Columns two spaces apart, left-aligned (right-aligned for the indexes in `right`), with no
    padding after the last column, so `grep 'name$'` and `awk` work on the output."""
    grid = [list(headers), *(list(row) for row in rows)]
    widths = [max(len(line[i]) for line in grid) for i in range(len(headers))]
    lines = []
    for line in grid:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def to_dict(message: Message) -> dict[str, object]:
    """The proto3 JSON mapping with field names as in the .proto and every field present, so the
    shape scripts see does not depend on which values happen to be set. (A proto3 `optional`
    scalar such as `exit_code` stays absent until it is set: absence is its meaning.)

    One departure from that mapping: 64-bit integers are JSON numbers, not strings, so that every
    number a script reads is a number (`"hits": 3` beside `"idle": 2`); ours never come near 2^53.
    """
    from google.protobuf import json_format

    document = json_format.MessageToDict(
        _with_every_submessage(message),
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
    )
    _int64_as_numbers(message.DESCRIPTOR, document)
    return document


# The field types the proto3 JSON mapping prints as strings.
_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
        FieldDescriptor.TYPE_SINT64,
    }
)


def _int64_as_numbers(descriptor: Any, document: dict[str, Any]) -> None:
    for field in descriptor.fields:
        if field.name not in document:
            continue
        value = document[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                value[key] = _number_or_recurse(entry, item)
        elif field.is_repeated:
            document[field.name] = [_number_or_recurse(field, item) for item in value]
        else:
            document[field.name] = _number_or_recurse(field, value)


def _number_or_recurse(field: Any, value: Any) -> Any:
    if field.type in _INT64_TYPES:
        return int(value)
    if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(value, dict):
        _int64_as_numbers(field.message_type, value)
    return value


def to_json(message: Message) -> str:
    """`to_dict` as indented JSON with sorted keys."""
    import json

    return json.dumps(to_dict(message), indent=2, sort_keys=True)


def phase_name(phase: int) -> str:
    """`Ready` rather than `SANDBOX_PHASE_READY`."""
    return _PHASES.get(phase, f"Phase{phase}")


def phase_label(status: sandbox_pb2.SandboxStatus) -> str:
    """The phase as a person reads it: `Exited (0)` carries the workload's exit code."""
    name = phase_name(status.phase)
    if status.phase == _EXITED and status.HasField("exit_code"):
        return f"{name} ({status.exit_code})"
    return name


def expiry_text(lifetime: sandbox_pb2.Lifetime) -> str:
    """When a sandbox's lifetime ends (UTC), with the TTL and the idle timeout that set it."""
    parts = []
    if lifetime.expires_at_ms:
        when = datetime.fromtimestamp(lifetime.expires_at_ms / 1000, tz=UTC)
        parts.append(f"{when.isoformat(timespec='seconds')} (ttl {lifetime.ttl_seconds} s)")
    if lifetime.idle_timeout_seconds:
        parts.append(f"after {lifetime.idle_timeout_seconds} s without an exec")
    return "; ".join(parts) or "never"


def format_age(created_ms: int, now_ms: int) -> str:
    """kubectl-style age: 42s, 5m, 3h, 2d."""
    if created_ms <= 0:
        return _NONE
    seconds = max(0, (now_ms - created_ms) // 1000)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 48 * 3600:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def format_bytes(value: int) -> str:
    """A size for people: one decimal in the largest binary unit it reaches ("1.5MiB", "512B")."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value}B"


def format_ms(value: float | None, *, sign: bool = False) -> str:
    """Milliseconds with two decimals (warm paths are single-digit ms), `-` when unreached. With
    `sign`, an offset: a warm sandbox's pool member was created and registered before the request."""
    if value is None:
        return _NONE
    return f"{value:+.2f} ms" if sign else f"{value:.2f} ms"


def timeline_offsets(timeline: sandbox_pb2.Timeline) -> list[tuple[str, float | None]]:
    """Each step as milliseconds after `requested`; None for steps not reached (or no request)."""
    start = timeline.requested_us
    offsets: list[tuple[str, float | None]] = []
    for label, field in TIMELINE_STEPS:
        at = int(getattr(timeline, field))
        offsets.append((label, (at - start) / 1000 if at and start else None))
    return offsets


def time_to_ready_ms(sandbox: sandbox_pb2.Sandbox) -> float | None:
    """Requested → Ready as the gateway measured it (not including CLI or network time)."""
    timeline = sandbox.status.timeline
    if not (timeline.requested_us and timeline.ready_us):
        return None
    return (timeline.ready_us - timeline.requested_us) / 1000


def hit_rate(hits: int, misses: int) -> str:
    """Percentage of creates served warm; `-` before the first create."""
    total = hits + misses
    return f"{100 * hits / total:.1f}%" if total else _NONE


def _allocation(status: sandbox_pb2.SandboxStatus) -> str:
    if not status.allocation:
        return _NONE
    refilled = next((c for c in status.conditions if c.type == "Allocated" and c.reason == "Refilled"), None)
    if refilled is not None:
        waited = (status.timeline.registered_us - status.timeline.requested_us) / 1000
        return f"{status.allocation} (pool {status.pool}, refilled: waited {waited:.0f} ms for a member)"
    if status.pool:
        return f"{status.allocation} (pool {status.pool})"
    return status.allocation


def _resources(resources: sandbox_pb2.Resources) -> str:
    pids = str(resources.pids) if resources.pids else _NONE
    return f"cpu {resources.cpu or _NONE}, memory {resources.memory or _NONE}, pids {pids}"


def _pairs(mapping: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(mapping)) or _NONE


def sandbox_table(sandboxes: Sequence[sandbox_pb2.Sandbox], *, now_ms: int) -> str:
    """`sandbox list`: one row per sandbox."""
    rows = [
        (
            sandbox.name,
            sandbox.workspace,
            phase_label(sandbox.status),
            sandbox.status.allocation or _NONE,
            format_age(sandbox.created_at_ms, now_ms),
            sandbox.spec.image or "(default)",
        )
        for sandbox in sandboxes
    ]
    return table(("NAME", "WORKSPACE", "PHASE", "ALLOCATION", "AGE", "IMAGE"), rows)


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _conditions_table(conditions: Sequence[sandbox_pb2.Condition]) -> str:
    if not conditions:
        return "  none"
    rows = [(c.type, c.status, c.reason, c.message) for c in conditions]
    return _indented(table(("TYPE", "STATUS", "REASON", "MESSAGE"), rows))


def _timeline_table(timeline: sandbox_pb2.Timeline) -> str:
    if not timeline.requested_us:
        return "  not recorded"
    requested = datetime.fromtimestamp(timeline.requested_us / 1e6, tz=UTC)
    rows = [("requested", requested.isoformat(timespec="milliseconds"))]
    rows += [(label, format_ms(offset, sign=True)) for label, offset in timeline_offsets(timeline)]
    return _indented(table(("", ""), rows, right=frozenset({1})).split("\n", 1)[1])


def _usage_rows(usage: sandbox_pb2.SandboxUsage) -> list[tuple[str, str]]:
    """What the sandbox uses now, as `sandbox get` lists it ("?" for a figure its driver cannot
    read; the reason follows). The writable root shows once a driver reports one. Only a
    GetSandbox reply carries a usage: other messages show no such rows; one with no figure at
    all (a sandbox that is not running) shows only why."""

    present = {field.name for field, _ in usage.ListFields()} - {"unknown", "read_at_ms"}
    if not present:
        return [("Usage", f"unknown: {usage.unknown}" if usage.unknown else "unknown")]

    def figure(name: str, text: Callable[[Any], str]) -> str:
        return text(getattr(usage, name)) if name in present else "?"

    memory = figure("memory_bytes", format_bytes)
    if usage.HasField("memory_peak_bytes"):
        memory += f" (peak {format_bytes(usage.memory_peak_bytes)})"
    rows = [
        ("CPU used", figure("cpu_seconds", lambda seconds: f"{seconds:.2f}s")),
        ("Memory", memory),
        ("Processes", figure("processes", str)),
        ("/workspace", figure("workspace_bytes", format_bytes)),
    ]
    if usage.HasField("root_bytes"):
        rows.append(("Writable root", format_bytes(usage.root_bytes)))
    if usage.HasField("egress_bytes_out"):
        egress = f"{format_bytes(usage.egress_bytes_out)} out, {format_bytes(usage.egress_bytes_in)} in"
        rows.append(("Egress", egress))
    if usage.unknown:
        rows.append(("Usage unknown", usage.unknown))
    return rows


def sandbox_details(sandbox: sandbox_pb2.Sandbox) -> str:
    """`sandbox get`: the fields, conditions and timeline of one sandbox."""
    status, spec = sandbox.status, sandbox.spec
    rows = [
        ("Name", sandbox.name),
        ("Workspace", sandbox.workspace),
        ("Id", sandbox.id),
        ("Phase", phase_label(status)),
        ("Allocation", _allocation(status)),
        ("Exit code", str(status.exit_code) if status.HasField("exit_code") else _NONE),
        ("Image", spec.image or "(default)"),
        ("Command", " ".join(spec.command) or "(none: idle, exec only)"),
        ("Resources", _resources(spec.resources)),
        ("Environment", ", ".join(sorted(spec.environment)) or _NONE),
        ("Injected", ", ".join(status.injected_environment) or _NONE),
        ("Secrets", ", ".join(sorted(spec.secrets)) or _NONE),
        ("Labels", _pairs(sandbox.labels.items())),
        ("Instance", status.instance_id or _NONE),
        ("Expires", expiry_text(sandbox.lifetime)),
        *(_usage_rows(status.usage) if status.HasField("usage") else ()),
    ]
    fields = table(("", ""), rows).split("\n", 1)[1]
    return "\n".join(
        (
            fields,
            "Conditions:",
            _conditions_table(status.conditions),
            "Timeline (after requested; negative: a warm member was made before the request):",
            _timeline_table(status.timeline),
        )
    )


def pools_view(response: sandbox_pb2.ListPoolsResponse) -> str:
    """`pool list`: one row per pool, the problems of any pool that cannot serve (invalid
    profiles, shapes shared by several pools, failing members), then misses by reason."""
    rows = []
    problems: list[str] = []
    for pool in response.pools:
        rows.append(
            (
                pool.name,
                pool.workspace or _NONE,
                pool.fingerprint[:12] or _NONE,
                f"{pool.desired}/{pool.ready}/{pool.idle}",
                str(pool.hits),
                str(pool.misses),
                hit_rate(pool.hits, pool.misses),
                ",".join(pool.accepted_environment) or _NONE,
            )
        )
        problems += [f"  {pool.name}: {c.reason}: {c.message}" for c in pool.conditions if c.status == "False"]
    headers = ("NAME", "WORKSPACE", "FINGERPRINT", "DESIRED/READY/IDLE", "HITS", "MISSES", "HIT RATE", "ACCEPTS")
    parts = [table(headers, rows, right=frozenset({6}))]
    if problems:
        # Said here, not only in the gateway log: an invalid profile otherwise looks like no pool.
        parts += ["Problems:", *problems]
    misses = ", ".join(f"{k} {v}" for k, v in sorted(response.misses_by_reason.items()))
    parts.append(f"Misses by reason: {misses or 'none'}")
    return "\n".join(parts)


def condition_lines(sandbox: sandbox_pb2.Sandbox) -> list[str]:
    """Why a sandbox is where it is, one `Type (Reason): message` line per condition."""
    lines = []
    for condition in sandbox.status.conditions:
        reason = f" ({condition.reason})" if condition.reason else ""
        message = f": {condition.message}" if condition.message else ""
        lines.append(f"{condition.type}={condition.status}{reason}{message}")
    return lines


def create_summary(sandbox: sandbox_pb2.Sandbox) -> str:
    """The line `sandbox create` prints once a sandbox is Ready."""
    allocation = _allocation(sandbox.status)
    took = format_ms(time_to_ready_ms(sandbox))
    return (
        f"sandbox {sandbox.name} (workspace {sandbox.workspace}) is "
        f"{phase_name(sandbox.status.phase)}: {allocation}, {took} to Ready"
    )


def egress_table(response: sandbox_pb2.ListEgressResponse) -> str:
    """`sandbox egress`: the policy, then one row per decision, oldest first."""
    rows = [
        (
            clock(d.time_ms),
            d.host,
            str(d.port),
            d.reason or ("allowed" if d.allowed else "denied"),
            str(d.bytes_up),
            str(d.bytes_down),
        )
        for d in response.decisions
    ]
    decisions = table(("TIME", "HOST", "PORT", "VERDICT", "UP", "DOWN"), rows, right=frozenset({2, 4, 5}))
    return f"Policy  {response.policy or '(none)'}\n{decisions}"


def clock(timestamp_ms: int) -> str:
    """HH:MM:SS.mmm (UTC) of a millisecond timestamp, for `sandbox watch` lines."""
    when = datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC) if timestamp_ms else None
    return when.strftime("%H:%M:%S.%f")[:-3] if when else "--:--:--.---"


def phase_line(sandbox: sandbox_pb2.Sandbox, *, now_ms: int) -> str:
    """`sandbox watch`: a phase transition (with the exit code once there is one)."""
    exit_code = f" (exit code {sandbox.status.exit_code})" if sandbox.status.HasField("exit_code") else ""
    return f"{clock(now_ms)}  phase {phase_name(sandbox.status.phase)}{exit_code}"


def progress_line(event: sandbox_pb2.ProgressEvent, *, now_ms: int) -> str:
    """`sandbox watch`: one progress event, stamped like the phase lines (when it arrived)."""
    return f"{clock(now_ms)}  {event.type or 'Normal'}  {event.reason}: {event.message}"
