"""Pure rendering: ages, durations, hit rates, the timeline and the views built from messages."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli import render


def _text(view: str) -> str:
    assert all(line == line.rstrip() for line in view.splitlines())  # no padding after the last column
    return view


@pytest.mark.parametrize(
    ("elapsed_ms", "expected"),
    [
        (0, "0s"),
        (119_999, "119s"),
        (120_000, "2m"),
        (7_199_000, "119m"),
        (7_200_000, "2h"),
        (47 * 3_600_000, "47h"),
        (48 * 3_600_000, "2d"),
    ],
)
def test_format_age_is_kubectl_like(elapsed_ms: int, expected: str) -> None:
    assert render.format_age(1_000, 1_000 + elapsed_ms) == expected


def test_format_age_of_an_unknown_creation_time_and_clock_skew() -> None:
    assert render.format_age(0, 5_000) == "-"
    assert render.format_age(10_000, 5_000) == "0s"  # created "in the future": never negative


@pytest.mark.parametrize(
    ("hits", "misses", "expected"), [(0, 0, "-"), (3, 1, "75.0%"), (0, 5, "0.0%"), (2, 0, "100.0%")]
)
def test_hit_rate(hits: int, misses: int, expected: str) -> None:
    assert render.hit_rate(hits, misses) == expected


def test_timeline_offsets_are_milliseconds_after_requested() -> None:
    timeline = pb.Timeline(requested_us=5_000_000, backend_created_us=5_000_800, activated_us=5_012_345)
    offsets = dict(render.timeline_offsets(timeline))
    assert offsets == {
        "backend created": 0.8,
        "claimed": None,
        "registered": None,
        "activated": 12.345,
        "ready": None,
        "exited": None,
    }


def test_timeline_without_a_request_time_has_no_offsets() -> None:
    offsets = render.timeline_offsets(pb.Timeline(ready_us=9))
    assert all(value is None for _, value in offsets)


def test_format_ms() -> None:
    assert render.format_ms(None) == "-"
    assert render.format_ms(1.234) == "1.23 ms"
    assert render.format_ms(0.5, sign=True) == "+0.50 ms"
    assert render.format_ms(-4122.934, sign=True) == "-4122.93 ms"  # a warm member registered earlier


def test_phase_names() -> None:
    assert render.phase_name(pb.SANDBOX_PHASE_READY) == "Ready"
    assert render.phase_name(pb.SANDBOX_PHASE_UNSPECIFIED) == "Unknown"
    assert render.phase_name(99) == "Phase99"


def test_the_hand_written_phase_names_cover_every_phase() -> None:
    names = {value: render.phase_name(value) for value in pb.SandboxPhase.values()}
    for value, name in names.items():
        generated = pb.SandboxPhase.Name(value).removeprefix("SANDBOX_PHASE_")
        assert name.upper() == generated.replace("UNSPECIFIED", "UNKNOWN")


def _sample() -> pb.Sandbox:
    return pb.Sandbox(
        id="sbx-1",
        name="box",
        workspace="team",
        labels={"b": "2", "a": "1"},
        spec=pb.SandboxSpec(
            image="",
            environment={"FOO": "secret-value"},
            resources=pb.Resources(cpu="200m", memory="256Mi", pids=64),
            command=["python", "-c", "print(1)"],
        ),
        status=pb.SandboxStatus(
            phase=pb.SANDBOX_PHASE_ERROR,
            allocation="warm",
            pool="python-small",
            exit_code=0,
            conditions=[pb.Condition(type="Ready", status="False", reason="WorkloadExited", message="[x]")],
            timeline=pb.Timeline(requested_us=1_000_000, ready_us=1_002_000, exited_us=1_500_000),
        ),
    )


def test_sandbox_details_show_every_section() -> None:
    lines = [" ".join(line.split()) for line in _text(render.sandbox_details(_sample())).splitlines()]
    assert "Phase Error" in lines
    assert "Allocation warm (pool python-small)" in lines
    assert "Exit code 0" in lines  # 0 is an exit code, not "unset"
    assert "Resources cpu 200m, memory 256Mi, pids 64" in lines
    assert "Labels a=1, b=2" in lines
    assert "Command python -c print(1)" in lines
    # Only environment names: values may be secrets.
    assert "Environment FOO" in lines
    assert "Ready False WorkloadExited [x]" in lines  # gateway text is printed as it is
    assert "ready +2.00 ms" in lines
    assert "exited +500.00 ms" in lines
    assert "claimed -" in lines


def test_sandbox_details_of_a_bare_sandbox() -> None:
    lines = [" ".join(line.split()) for line in _text(render.sandbox_details(pb.Sandbox())).splitlines()]
    assert "Exit code -" in lines
    assert "Allocation -" in lines
    assert "Command (none: idle, exec only)" in lines
    assert "none" in lines  # no conditions
    assert "not recorded" in lines  # no timeline


def test_sandbox_table_rows() -> None:
    sandboxes = [_sample(), pb.Sandbox(name="[bold]odd[/bold]", workspace="default")]
    rows = [line.split() for line in _text(render.sandbox_table(sandboxes, now_ms=0)).splitlines()]
    assert rows[1] == ["box", "team", "Error", "warm", "-", "(default)"]
    assert rows[2][0] == "[bold]odd[/bold]"
    assert rows[2][2:4] == ["Unknown", "-"]


def test_pools_view_without_pools_or_misses() -> None:
    text = _text(render.pools_view(pb.ListPoolsResponse()))
    assert "Misses by reason: none" in text


def test_condition_lines() -> None:
    sandbox = _sample()
    sandbox.status.conditions.append(pb.Condition(type="PoolMiss", status="True"))
    assert render.condition_lines(sandbox) == [
        "Ready=False (WorkloadExited): [x]",
        "PoolMiss=True",
    ]


def test_create_summary() -> None:
    sandbox = _sample()
    sandbox.status.phase = pb.SANDBOX_PHASE_READY
    assert render.create_summary(sandbox) == (
        "sandbox box (workspace team) is Ready: warm (pool python-small), 2.00 ms to Ready"
    )


def test_to_dict_has_a_stable_shape() -> None:
    document = render.to_dict(pb.Sandbox(name="x"))
    assert document["spec"] == {
        "image": "",
        "environment": {},
        "resources": {"cpu": "", "memory": "", "pids": 0},
        "command": [],
        "runtime_class_name": "",
        "secrets": {},
        "network": {"allow": [], "deny": []},
        "secret_hosts": {},
        "no_command": False,
    }
    status = document["status"]
    assert isinstance(status, dict)
    assert status["timeline"]["ready_us"] == 0  # a number, though proto3 JSON prints int64 as a string
    assert "exit_code" not in status  # absent until the workload exits


def _numbers_and_digit_strings(value: object) -> tuple[list[object], list[str]]:
    numbers: list[object] = []
    strings: list[str] = []
    if isinstance(value, dict):
        items: list[object] = list(value.values())
    elif isinstance(value, list):
        items = list(value)
    else:
        items = [value]
    for item in items:
        if isinstance(item, dict | list):
            more_numbers, more_strings = _numbers_and_digit_strings(item)
            numbers += more_numbers
            strings += more_strings
        elif isinstance(item, int | float) and not isinstance(item, bool):
            numbers.append(item)
        elif isinstance(item, str) and item.isdigit():
            strings.append(item)
    return numbers, strings


@given(big=st.integers(min_value=1, max_value=2**53), small=st.integers(min_value=1, max_value=2**31 - 1))
def test_every_integer_is_a_json_number(big: int, small: int) -> None:
    sandbox = pb.Sandbox(name="x", created_at_ms=big, resource_version=big)
    for _, field in render.TIMELINE_STEPS:
        setattr(sandbox.status.timeline, field, big)
    sandbox.status.timeline.requested_us = big
    sandbox.status.exit_code = small
    sandbox.status.conditions.append(pb.Condition(type="Ready", last_transition_time_ms=big))
    pools = pb.ListPoolsResponse(
        pools=[pb.Pool(name="p", desired=small, ready=small, idle=small, hits=big, misses=big)],
        misses_by_reason={"NoMatch": big},
    )
    for message in (sandbox, pools, pb.SandboxEvent(sandbox=sandbox)):
        numbers, digit_strings = _numbers_and_digit_strings(json.loads(render.to_json(message)))
        assert digit_strings == []
        assert big in numbers
    document = render.to_dict(pools)
    assert document["pools"][0]["resources"] == {"cpu": "", "memory": "", "pids": 0}  # type: ignore[index]
    assert document["misses_by_reason"] == {"NoMatch": big}


def test_to_dict_keeps_the_oneof_member_of_an_event() -> None:
    assert render.to_dict(pb.SandboxEvent(deleted="id")) == {"deleted": "id"}


def test_progress_and_phase_lines() -> None:
    progress = pb.ProgressEvent(timestamp_ms=1, reason="Claimed", message="pool env")
    assert render.progress_line(progress, now_ms=3_723_004) == "01:02:03.004  Normal  Claimed: pool env"
    sandbox = pb.Sandbox(status=pb.SandboxStatus(phase=pb.SANDBOX_PHASE_ERROR, exit_code=2))
    assert render.phase_line(sandbox, now_ms=0) == "--:--:--.---  phase Error (exit code 2)"


def test_tables_have_no_padding_after_the_last_column() -> None:
    sandboxes = [pb.Sandbox(name="a-much-longer-name", spec=pb.SandboxSpec(image="/x"))]
    sandboxes.append(pb.Sandbox(name="short"))
    lines = render.sandbox_table(sandboxes, now_ms=0).splitlines()
    assert lines[1].endswith(" /x")
    assert lines[2].endswith(" (default)")
    assert all(line == line.rstrip() for line in lines)
    assert lines[0].index("WORKSPACE") == lines[1].index("  ", len("a-much-longer-name") - 1) + 2


def test_table_aligns_columns_and_right_aligns_on_request() -> None:
    text = render.table(("A", "NUM"), [("long-cell", "1"), ("x", "100")], right=frozenset({1}))
    assert text.splitlines() == ["A          NUM", "long-cell    1", "x          100"]


def test_pools_view_lists_problems_of_pools_that_cannot_serve() -> None:
    invalid = pb.Pool(
        name="typo",
        conditions=[pb.Condition(type="ProfileValid", status="False", reason="InvalidProfile", message="t.toml:2: x")],
    )
    fine = pb.Pool(name="ok", workspace="default", fingerprint="a" * 64, desired=1, ready=1, idle=1)
    fine.conditions.append(pb.Condition(type="Healthy", status="True", reason="Fine"))
    lines = _text(render.pools_view(pb.ListPoolsResponse(pools=[fine, invalid]))).splitlines()
    assert lines[2].split() == ["typo", "-", "-", "0/0/0", "0", "0", "-", "-"]
    assert lines[3:] == ["Problems:", "  typo: InvalidProfile: t.toml:2: x", "Misses by reason: none"]
