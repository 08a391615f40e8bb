"""Readiness and liveness probes run against local processes: exec runs the command with the
container's environment (in its mount namespace); httpGet and tcpSocket dial 127.0.0.1 in the
pod's network namespace (the host's, for pods without one)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from typing import Any

from kubesim.kubelet import containers, netns

Obj = dict[str, Any]


def _port(container: Obj, port: Any) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for cport in container.get("ports") or []:
        if cport.get("name") == port:
            return int(cport["containerPort"])
    raise ValueError(f"unknown named port {port!r}")


async def probe(
    probe_spec: Obj,
    container: Obj,
    env: dict[str, str],
    cwd: str,
    *,
    prefix: Sequence[str] = (),
    netns_path: str | None = None,
) -> bool:
    """Run one probe; True on success. Timeouts and errors count as failures. ``prefix`` runs an
    exec probe inside the container's mount namespace (``kubesim.kubelet.mountns``); ``netns_path``
    dials httpGet and tcpSocket probes inside the pod's network namespace."""
    timeout = float(probe_spec.get("timeoutSeconds") or 1)
    try:
        async with asyncio.timeout(timeout):
            if "exec" in probe_spec:
                return await _exec([*prefix, *(probe_spec["exec"].get("command") or [])], env, cwd)
            if "httpGet" in probe_spec:
                return await _http(probe_spec["httpGet"], container, netns_path)
            if "tcpSocket" in probe_spec:
                port = _port(container, probe_spec["tcpSocket"]["port"])
                _, writer = await netns.open_connection(netns_path, "127.0.0.1", port)
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                return True
    except (TimeoutError, OSError, ValueError):
        return False
    return True  # a probe with no handler (e.g. grpc, unsupported) counts as passing


async def _exec(command: list[str], env: dict[str, str], cwd: str) -> bool:
    proc = await containers.start_piped(
        command,
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
        # Closed here, which kills it if it still runs: a probe cancelled with its pod (or by its
        # timeout) as the kubelet's loop closes would otherwise leave the transport to the
        # collector, reported unclosed in whatever test runs then (containers.PipedProcess).
        running = proc.returncode is None
        proc.close()
        if running:
            await proc.wait()


async def _http(spec: Obj, container: Obj, netns_path: str | None) -> bool:
    """GET the probe's path over HTTP/1.0 (what the kubelet's prober checks: a 2xx or 3xx)."""
    port = _port(container, spec.get("port"))
    reader, writer = await netns.open_connection(netns_path, "127.0.0.1", port)
    try:
        if str(spec.get("scheme") or "HTTP").upper() == "HTTPS":
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            await writer.start_tls(context)
        headers = "".join(f"{h['name']}: {h['value']}\r\n" for h in spec.get("httpHeaders") or [])
        request = f"GET {spec.get('path') or '/'} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{headers}\r\n"
        writer.write(request.encode())
        await writer.drain()
        status_line = (await reader.readline()).decode(errors="replace").split()
        return len(status_line) >= 2 and status_line[1].isdigit() and 200 <= int(status_line[1]) < 400
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
