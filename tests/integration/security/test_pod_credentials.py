"""What a workload on Kubernetes (kubesim) can find of its pod's credentials: it runs in a
container of its own beside its supervisor's (its own mount and PID namespaces, only the volumes
it mounts), so nothing of the supervisor is in its reach. Not the pod's projected ServiceAccount
token (mounted into the supervisor's container only; `drivers_kubernetes/test_attacks.py`
replays a copy taken on the node), not the sandbox token the supervisor was activated with (a JWT
of the gateway's), not the gateway's API token, and the request's secrets nowhere but the
workload's own environment (where they are delivered on purpose): not in any process's command
line or readable environment, not in a file of the workload's mounts.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubesim.cluster import RunningCluster
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_kubernetes.conftest import admin, cluster, gateway_settings  # noqa: F401
from tests.integration.drivers_kubernetes.test_attacks import pod_token
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = pytest.mark.timeout(180)

SECRET = "rt-pod-secret-5e0b9a"

# Run as the workload: every process's command line and (where readable) environment, and every
# small regular file under the places a credential could be left; printed as JSON.
SEARCH = r"""
import json, os, stat, sys
found = {"cmdline": {}, "environ": {}, "unreadable_environ": [], "files": {}}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        found["cmdline"][pid] = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
    except OSError:
        continue
    try:
        found["environ"][pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
    except OSError:
        found["unreadable_environ"].append(pid)
for top in sys.argv[1:]:
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
                    continue  # a FIFO or socket would block the open
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    found["files"][path] = f.read().decode(errors="replace")
            except OSError:
                pass
print(json.dumps(found))
"""
# The workload container's mounts, and where tokens are mounted. A kubesim container sees the
# host's other paths (it is a process tree in its own mount and PID namespaces, not a container
# with an image), so those are not the pod's and are not searched; a real container's writable
# layer is not covered here.
PLACES = ["/workspace", "/var/run/secrets", "/run/secrets", "/.warmshell"]
JWT = re.compile(r"eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:  # noqa: F811
    state = tmp_path / "state"
    async with running_gateway(state, **gateway_settings(cluster, state)) as running:
        yield running


async def test_the_workload_finds_no_credential(
    gw: RunningGateway,
    cluster: RunningCluster,  # noqa: F811
) -> None:
    await gw.create(name="victim", spec=pb.SandboxSpec(environment={"PLAIN": "yes"}, secrets={"DB_PASSWORD": SECRET}))
    victim = await gw.wait_ready("victim", timeout=60)
    assert victim.status.phase == pb.SANDBOX_PHASE_READY
    assert pod_token(cluster, victim)  # it exists, on the node and in the supervisor's container
    # Something the search must find, so that finding nothing else proves something.
    assert await gw.exec("victim", ["sh", "-c", "echo canary > /workspace/canary"]) == (0, b"", b"")
    code, out, err = await gw.exec("victim", [sys.executable, "-c", SEARCH, *PLACES])
    assert code == 0, err
    found = json.loads(out)
    assert found["files"].get("/workspace/canary") == "canary\n"
    me = [pid for pid, text in found["environ"].items() if SECRET in text]
    supervisors = [pid for pid, line in found["cmdline"].items() if "supervisor" in line]
    assert supervisors == [], f"the supervisor is among the processes seen: {found['cmdline']}"
    assert "warmshell-agent" in found["cmdline"]["1"]  # pid 1 of the workload's own namespace
    # (Environments are readable on kubesim, which ignores the pod's securityContext: see the
    # xfail below. Whatever is readable is searched.)
    for where, texts in (("cmdline", found["cmdline"]), ("environ", found["environ"]), ("file", found["files"])):
        for place, text in texts.items():
            assert gw.token not in text, f"the gateway's API token in {where} {place}"
            assert not JWT.findall(text), f"a JWT in {where} {place}"
            if where != "environ":
                assert SECRET not in text, f"the request's secret in {where} {place}"
    # Delivered where it belongs: the workload's own environment (this exec's process).
    assert me, "the secret did not reach the workload's environment"


CAP_SYS_PTRACE = 19


@pytest.mark.xfail(
    strict=True,
    reason="kubesim runs a pod's containers as host root with every capability, ignoring the pod's"
    " securityContext (runAsNonRoot, runAsUser, capabilities.drop ALL, allowPrivilegeEscalation false):"
    " the workload then has CAP_SYS_PTRACE and reads its non-dumpable supervisor's environ and memory."
    " tests/integration/supervisor/test_undumpable.py covers the supervisor with a real uid drop.",
)
async def test_the_workload_runs_as_its_pod_spec_says_without_capabilities(gw: RunningGateway) -> None:
    await gw.create(name="caps")
    ready = await gw.wait_ready("caps", timeout=60)
    assert ready.status.phase == pb.SANDBOX_PHASE_READY
    code, out, err = await gw.exec("caps", ["sh", "-c", "grep -E '^(Uid|CapEff):' /proc/self/status"])
    assert code == 0, err
    fields = dict(line.split(":", 1) for line in out.decode().splitlines())
    assert fields["Uid"].split()[0] != "0", "the workload runs as root"
    assert not int(fields["CapEff"].strip(), 16) & (1 << CAP_SYS_PTRACE), "the workload has CAP_SYS_PTRACE"
    code, _, _ = await gw.exec("caps", ["sh", "-c", "cat /proc/1/environ > /dev/null"])
    assert code != 0, "the supervisor's environment is readable"
