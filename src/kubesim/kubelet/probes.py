"""Readiness probes run against local processes: exec runs the command with the container's
environment; httpGet and tcpSocket dial 127.0.0.1 (every pod shares the host's network here)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp

Obj = dict[str, Any]


def _port(container: Obj, port: Any) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for cport in container.get("ports") or []:
        if cport.get("name") == port:
            return int(cport["containerPort"])
    raise ValueError(f"unknown named port {port!r}")


async def probe(probe_spec: Obj, container: Obj, env: dict[str, str], cwd: str) -> bool:
    """Run one probe; True on success. Timeouts and errors count as failures."""
    timeout = float(probe_spec.get("timeoutSeconds") or 1)
    try:
        async with asyncio.timeout(timeout):
            if "exec" in probe_spec:
                return await _exec(probe_spec["exec"].get("command") or [], env, cwd)
            if "httpGet" in probe_spec:
                return await _http(probe_spec["httpGet"], container)
            if "tcpSocket" in probe_spec:
                port = _port(container, probe_spec["tcpSocket"]["port"])
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                return True
    except (TimeoutError, OSError, aiohttp.ClientError, ValueError):
        return False
    return True  # a probe with no handler (e.g. grpc, unsupported) counts as passing


async def _exec(command: list[str], env: dict[str, str], cwd: str) -> bool:
    proc = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _http(spec: Obj, container: Obj) -> bool:
    port = _port(container, spec.get("port"))
    scheme = str(spec.get("scheme") or "HTTP").lower()
    url = f"{scheme}://127.0.0.1:{port}{spec.get('path') or '/'}"
    headers = {h["name"]: h["value"] for h in spec.get("httpHeaders") or []}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=False) as r:
        return 200 <= r.status < 400
