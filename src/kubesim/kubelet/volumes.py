"""Volumes and environment for pod processes that are not in containers.

Mount scheme: each pod gets a root directory ``<poddir>``; a volume mounted at ``mountPath`` is
found at ``<poddir>/<mountPath>`` (a symlink to the volume's directory). The process is told its
root through ``KUBESIM_POD_ROOT`` (alias ``KUBESIM_VOLUME_ROOT``), so a program that would open
``/var/run/secrets/tokens/token`` opens ``$KUBESIM_POD_ROOT/var/run/secrets/tokens/token``. Env
values are not rewritten. Projected ServiceAccount tokens come from the API server's TokenRequest,
bound to the Pod, and are refreshed at 80 % of their lifetime like the real kubelet does.
"""

from __future__ import annotations

import asyncio
import base64
import os
import pathlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

from kubesim.controllers import client as kc

Obj = dict[str, Any]
#: Writes the token files of one projected source; returns the token lifetime in seconds.
TokenWriter = Callable[[], Awaitable[int]]


def host_path(pod_root: pathlib.Path, mount_path: str) -> pathlib.Path:
    return pod_root / mount_path.lstrip("/")


async def materialise(
    api: kc.KubeClient, pod: Obj, pod_root: pathlib.Path, *, claims: pathlib.Path | None = None
) -> tuple[dict[str, pathlib.Path], list[TokenWriter]]:
    """Create every volume of ``pod`` under ``pod_root/.volumes``; return their dirs and the token
    writers to re-run for refresh. A PersistentVolumeClaim is one host directory per claim under
    ``claims`` that outlives the pod (and the claim is reported Bound)."""
    vol_root = pod_root / ".volumes"
    ns = pod["metadata"]["namespace"]
    dirs: dict[str, pathlib.Path] = {}
    writers: list[TokenWriter] = []
    for volume in pod.get("spec", {}).get("volumes") or []:
        vdir = vol_root / volume["name"]
        if "persistentVolumeClaim" in volume and claims is not None:
            vdir = await _claim_dir(api, ns, volume["persistentVolumeClaim"]["claimName"], claims)
        vdir.mkdir(parents=True, exist_ok=True)
        dirs[volume["name"]] = vdir
        if "projected" in volume:
            for source in volume["projected"].get("sources") or []:
                if "serviceAccountToken" in source:
                    writer = _token_writer(api, pod, source["serviceAccountToken"], vdir)
                    await writer()
                    writers.append(writer)
                elif "configMap" in source:
                    await _write_keys(api, kc.CONFIGMAPS, ns, source["configMap"], vdir, False)
                elif "secret" in source:
                    await _write_keys(api, kc.SECRETS, ns, source["secret"], vdir, True)
                elif "downwardAPI" in source:
                    _write_downward(pod, source["downwardAPI"], vdir)
        elif "configMap" in volume:
            await _write_keys(api, kc.CONFIGMAPS, ns, volume["configMap"], vdir, False)
        elif "secret" in volume:
            src = dict(volume["secret"])
            src.setdefault("name", src.get("secretName"))
            await _write_keys(api, kc.SECRETS, ns, src, vdir, True)
        elif "downwardAPI" in volume:
            _write_downward(pod, volume["downwardAPI"], vdir)
        # emptyDir, persistentVolumeClaim and the rest are plain directories here.
    return dirs, writers


async def _claim_dir(api: kc.KubeClient, ns: str, claim: str, claims: pathlib.Path) -> pathlib.Path:
    """The claim's directory (keyed by its uid, so a re-created claim starts empty); marks it Bound."""
    pvc = await api.get(kc.PVCS, ns, claim)
    if (pvc.get("status") or {}).get("phase") != "Bound":
        spec = pvc.get("spec") or {}
        status = {
            "phase": "Bound",
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")},
        }
        await api.patch(kc.PVCS, ns, claim, {"status": status}, sub="status")
    return claims / f"{ns}_{claim}_{pvc['metadata']['uid'][:8]}"


def binds(container: Obj, volume_dirs: dict[str, pathlib.Path]) -> list[tuple[pathlib.Path, str, bool]]:
    """(source, mountPath, readOnly) of each volumeMount, for a mount namespace."""
    out = []
    for vm in container.get("volumeMounts") or []:
        source = volume_dirs.get(vm["name"])
        if source is None:
            continue
        if vm.get("subPath"):
            source = source / vm["subPath"]
        out.append((source, str(vm["mountPath"]), bool(vm.get("readOnly"))))
    return out


def hosts_file(pod: Obj, ip: str, services: list[Obj]) -> str:
    """The pod's /etc/hosts: localhost, its own name, hostAliases and every Service's cluster
    DNS names (``NAME.NAMESPACE.svc`` and ``….svc.cluster.local``) at its ClusterIP."""
    name = str(pod["metadata"].get("name", ""))
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{ip}\t{name}"]
    for alias in (pod.get("spec") or {}).get("hostAliases") or []:
        lines.append(f"{alias.get('ip')}\t{' '.join(alias.get('hostnames') or [])}")
    pod_ns = pod["metadata"].get("namespace", "")
    for svc in services:
        ip_ = (svc.get("spec") or {}).get("clusterIP")
        if not ip_ or ip_ == "None":
            continue
        sname, sns = svc["metadata"]["name"], svc["metadata"].get("namespace", "")
        names = [f"{sname}.{sns}.svc.cluster.local", f"{sname}.{sns}.svc", f"{sname}.{sns}"]
        if sns == pod_ns:
            names.append(sname)
        lines.append(f"{ip_}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"


def mount(pod_root: pathlib.Path, container: Obj, volume_dirs: dict[str, pathlib.Path]) -> None:
    """Expose each volumeMount of ``container`` at ``<pod_root>/<mountPath>``."""
    for source, mount_path, _ in binds(container, volume_dirs):
        if not source.exists():
            source.mkdir(parents=True)  # a subPath the volume does not have yet
        target = host_path(pod_root, mount_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            continue
        target.symlink_to(source, target_is_directory=source.is_dir())


def _token_writer(api: kc.KubeClient, pod: Obj, source: Obj, vdir: pathlib.Path) -> TokenWriter:
    sa = pod.get("spec", {}).get("serviceAccountName") or "default"
    audience = source.get("audience")
    expiration = int(source.get("expirationSeconds") or 3600)
    path = vdir / source.get("path", "token")

    async def write() -> int:
        status = await _request_token(api, pod, sa, audience, expiration)
        _atomic_write(path, str(status.get("token", "")).encode(), 0o600)
        return expiration

    return write


async def _request_token(api: kc.KubeClient, pod: Obj, sa: str, audience: str | None, expiration: int) -> Obj:
    ns = pod["metadata"]["namespace"]
    audiences = [audience] if audience else []
    try:
        return await api.request_token(ns, sa, audiences=audiences, expiration_seconds=expiration, pod=pod)
    except kc.ApiError as exc:
        if not exc.not_found:
            raise
    # kube-controller-manager creates each namespace's "default" ServiceAccount; we stand in for it.
    try:
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}
        await api.create(kc.SERVICEACCOUNTS, ns, body)
    except kc.ApiError as exc:
        if not exc.already_exists:
            raise
    return await api.request_token(ns, sa, audiences=audiences, expiration_seconds=expiration, pod=pod)


async def refresh_tokens(writers: list[TokenWriter], lifetime: int) -> None:
    """Rewrite tokens at 80 % of their lifetime, forever (cancelled with the pod)."""
    if not writers:
        return
    while True:
        await asyncio.sleep(max(1.0, lifetime * 0.8))
        for writer in writers:
            lifetime = await writer()


async def _write_keys(
    api: kc.KubeClient, res: kc.Resource, ns: str, src: Obj, vdir: pathlib.Path, secret: bool
) -> None:
    try:
        obj = await api.get(res, ns, src["name"])
    except kc.ApiError as exc:
        if exc.not_found and src.get("optional"):
            return
        raise
    data: dict[str, bytes] = {}
    for k, v in (obj.get("data") or {}).items():
        data[k] = base64.b64decode(v) if secret else str(v).encode()
    for k, v in (obj.get("binaryData") or {}).items():
        data[k] = base64.b64decode(v)
    if not secret:
        for k, v in (obj.get("stringData") or {}).items():
            data[k] = str(v).encode()
    items = src.get("items")
    if items:
        for item in items:
            if item["key"] in data:
                _atomic_write(vdir / item["path"], data[item["key"]], 0o644)
    else:
        for k, v in data.items():
            _atomic_write(vdir / k, v, 0o644)


def _write_downward(pod: Obj, src: Obj, vdir: pathlib.Path) -> None:
    for item in src.get("items") or []:
        ref = item.get("fieldRef")
        if ref:
            value = field_value(pod, ref["fieldPath"])
            _atomic_write(vdir / item["path"], value.encode(), 0o644)


def _atomic_write(path: pathlib.Path, data: bytes, mode: int) -> None:
    # Readers polling the file (token refresh) must never see a half-written token.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: Obj, field_path: str) -> str:
    """The downward API's ``fieldRef``."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if field_path in simple:
        return str(simple[field_path] or "")
    if field_path == "status.podIPs":
        return ",".join(ip.get("ip", "") for ip in status.get("podIPs") or [])
    match = _SUBSCRIPT.match(field_path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ValueError(f"unsupported fieldRef {field_path!r}")


_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are substituted, ``$$`` escapes a ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(sub, value)


async def container_env(api: kc.KubeClient, pod: Obj, container: Obj, base: dict[str, str]) -> dict[str, str]:
    """The container's environment on top of ``base``: envFrom, then env (later wins)."""
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, res, secret in (("configMapRef", kc.CONFIGMAPS, False), ("secretRef", kc.SECRETS, True)):
            ref = src.get(kind)
            if ref:
                data = await _ref_data(api, res, ns, ref, secret)
                env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        vf = item["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_value(pod, vf["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
            secret = "secretKeyRef" in vf
            ref = vf["secretKeyRef" if secret else "configMapKeyRef"]
            data = await _ref_data(api, kc.SECRETS if secret else kc.CONFIGMAPS, ns, ref, secret)
            if ref["key"] in data:
                env[name] = data[ref["key"]]
            elif not ref.get("optional"):
                raise KeyError(f"key {ref['key']!r} not found in {ref['name']!r}")
    return env


async def _ref_data(api: kc.KubeClient, res: kc.Resource, ns: str, ref: Obj, secret: bool) -> dict[str, str]:
    try:
        obj = await api.get(res, ns, ref["name"])
    except kc.ApiError as exc:
        if exc.not_found and ref.get("optional"):
            return {}
        raise
    data = obj.get("data") or {}
    if secret:
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
    return {k: str(v) for k, v in data.items()}
