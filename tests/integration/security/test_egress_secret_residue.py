"""Where a placeholder secret's real value must never be, after a request that used it: the
sandbox's agent and its egress relays (their writable memory, read host-side through
/proc/PID/mem), the gateway's log records, and the files of its state directory (the SQLite
store and its journal included). The gateway's own memory holds it: that is the one place."""

from __future__ import annotations

import logging
import os
import re
import secrets
from pathlib import Path

import pytest

from tests.helpers.gateway import running_gateway
from tests.helpers.upstreams import upstream
from tests.integration.security.support import process_tree, sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(os.geteuid() != 0, reason="reading another process's memory takes root"),
]
# The agent (pid 1 inside) and its relays (forks of it, one per connection) run the one binary, bound here.
_AGENT = b"/run/warmshell/agent"
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+)")


def _writable_memory(pid: int) -> bytes:
    """The writable mappings of `pid` (heap, stacks, data), concatenated."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            found = _MAPPING.match(line)
            if found is None or "w" not in found.group(3):
                continue
            start, end = int(found.group(1), 16), int(found.group(2), 16)
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except OSError:  # a guard page or a mapping gone meanwhile
                continue
    return b"".join(chunks)


def _agents() -> list[int]:
    pids = []
    for pid in sorted(process_tree(os.getpid()) - {os.getpid()}):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == _AGENT:
                pids.append(pid)
        except OSError:
            continue
    return pids


async def test_the_value_is_in_no_agent_memory_log_record_or_store_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    value = "residue-" + secrets.token_hex(16)
    async with (
        upstream("127.0.0.2") as api,
        running_gateway(tmp_path / "state", **{"network.requests_may_widen": True}) as gw,
    ):
        spec = pb.SandboxSpec(network=pb.NetworkPolicy(allow=[api.authority]))
        spec.secrets["API_KEY"] = value
        spec.secret_hosts["API_KEY"].hosts.append(api.authority)
        await sandbox(gw, "res", spec)
        code, token, _ = await sh(gw, "res", 'printf %s "$API_KEY"')
        assert code == 0
        for path in ("/a", "/b"):
            command = f'curl -sS -H "Authorization: Bearer $API_KEY" http://{api.authority}{path}'
            assert (await sh(gw, "res", command))[0] == 0
        assert all(f"Bearer {value}".encode() in head for head in api.heads)  # it was swapped in
        agents = _agents()
        assert agents  # pid 1, and any relay still closing
        memory = {pid: _writable_memory(pid) for pid in agents}
        # The scan sees what they hold: the placeholder (the workload's environment, the relayed heads).
        assert any(token.encode() in held for held in memory.values())
        assert [pid for pid, held in memory.items() if value.encode() in held] == []
        state_files = [path for path in (tmp_path / "state").rglob("*") if path.is_file()]
        assert any(path.name == "warmshell.db" for path in state_files)
        assert [path for path in state_files if value.encode() in path.read_bytes()] == []
    assert caplog.records  # the gateway logged (start, create, stop) ...
    assert value not in caplog.text  # ... and never the value
