"""CPU of each piece a secret adds to a warm create, measured alone (this process's CPU, every
thread, per call; rounds alternate the pieces): the vault's sealing and opening and their AES-GCM
calls, its store row written, read and deleted on a real SQLite store (and written after a record's
insert, in the same batch, or in the insert's own statement) (on the filesystem of `--dir`, where
the benchmark's gateways keep their state), the placeholder's making, and the system bundle's
relink of an intercepting activation (as part 6 left it, and `trust.relink`); each also with the
caches cold (32 MiB copied before each call), as between two creates in a gateway.

    python bench/investigations/egress-streams/secret_parts.py [--calls 2000] [--rounds 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from warmshell.core import egress
from warmshell.core.ids import SandboxId
from warmshell.gateway.egress import placeholders
from warmshell.gateway.egress.credentials import ProxyCredentials
from warmshell.gateway.egress.gate import _SHARED_BUNDLE
from warmshell.gateway.secretvault import KIND_SECRETS, SecretVault, _context
from warmshell.gateway.store.sqlite import open_sqlite_store
from warmshell.sandboxio import trust

HOST = "127.0.0.2:8080"
VALUES = {"API_KEY": "sk-bench"}
HOSTS = {"API_KEY": [HOST]}
PAYLOAD = "x" * 1500  # about a sandbox record's JSON


def _open(aead: AESGCM, sid: SandboxId, payload: str) -> object:
    """`SecretVault.get` after its store read."""
    raw = base64.b64decode(json.loads(payload)["sealed"], validate=True)
    return json.loads(aead.decrypt(raw[:12], raw[12:], _context(sid)))


def per_call_us(run: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        run()
    return (time.process_time() - start) * 1e6 / calls


_FILLER = (bytearray(32 << 20), bytes(32 << 20))


def per_cold_call_us(run: Callable[[], object], calls: int) -> float:
    """As `per_call_us`, but 32 MiB copied (outside the timing) before each call: the caches as
    a create's other ~5 ms of work leave them."""
    total = 0
    for _ in range(calls):
        _FILLER[0][:] = _FILLER[1]
        start = time.thread_time_ns()
        run()
        total += time.thread_time_ns() - start
    return total / 1e3 / calls


def per_fresh_member_us(run: Callable[[Path], object], root: Path, calls: int) -> float:
    """CPU per call of `run` on an egress directory as a member's start leaves it (only the link
    to the host's bundle there), made afresh (outside the timing) for each call."""
    total = 0
    root.mkdir()
    for number in range(calls):
        directory = root / f"m{number}"
        directory.mkdir()
        os.symlink("/etc/ssl/certs/ca-certificates.crt", directory / egress.SYSTEM_BUNDLE_COPY)
        start = time.thread_time_ns()
        run(directory)
        total += time.thread_time_ns() - start
    shutil.rmtree(root)
    return total / 1e3 / calls


def _relinked_as_before(directory: Path) -> None:
    """The system bundle's relink as part 6 left it: a path's lexists, then `replace_links`."""
    if os.path.lexists(directory / egress.SYSTEM_BUNDLE_COPY):
        trust.replace_links(directory, {egress.SYSTEM_BUNDLE_COPY: _SHARED_BUNDLE})


def _relinked(directory: Path) -> None:
    """The system bundle's relink now: `trust.relink`, its check made on the opened directory."""
    trust.relink(directory, egress.SYSTEM_BUNDLE_COPY, _SHARED_BUNDLE)


async def per_await_us(run: Callable[[int], Awaitable[object]], calls: int) -> float:
    start = time.process_time()
    for number in range(calls):
        await run(number)
    return (time.process_time() - start) * 1e6 / calls


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    key = os.urandom(32)
    aead = AESGCM(key)
    sid = SandboxId("sb-0123456789abcdef")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store = await open_sqlite_store(Path(tmp) / "store.db")
        vault = SecretVault(store, key)
        sealed = vault._seal(sid, VALUES)
        raw = base64.b64decode(json.loads(sealed)["sealed"])
        links = Path(tmp) / "egress"
        links.mkdir()
        os.symlink("/etc/ssl/certs/ca-certificates.crt", links / egress.SYSTEM_BUNDLE_COPY)
        credentials = ProxyCredentials(key)
        nonce = secrets.token_bytes(16)
        placeholders.make(VALUES, HOSTS)  # the rule's parse cached, as in a running gateway
        sync: dict[str, Callable[[], object]] = {
            "AESGCM(key): the key schedule (once per gateway)": lambda: AESGCM(key),
            "aead.encrypt (12-byte nonce, 20-byte secret)": lambda: aead.encrypt(
                raw[:12], b'{"API_KEY": "sk-bench"}', _context(sid)
            ),
            "aead.decrypt": lambda: aead.decrypt(raw[:12], raw[12:], _context(sid)),
            "vault._seal (nonce, JSON, encrypt, base64, JSON)": lambda: vault._seal(sid, VALUES),
            "open without the store (JSON, base64, decrypt, JSON)": lambda: _open(aead, sid, sealed),
            "placeholders.make (one secret, one host; rule cached)": lambda: placeholders.make(VALUES, HOSTS),
            "secrets.token_urlsafe(24) (the token)": lambda: secrets.token_urlsafe(24),
            "egress.parse_secret_host (cached rule)": lambda: egress.parse_secret_host(HOST, field="f"),
            "credentials.placeholder (a pod's token: one HMAC)": lambda: credentials.placeholder(sid, nonce, "API_KEY"),
            "the system bundle's relink, as part 6 left it": lambda: _relinked_as_before(links),
            "the system bundle's relink, trust.relink": lambda: _relinked(links),
        }

        async def put(n: int) -> None:
            (row,) = vault.sealed(SandboxId(f"sb-{n:016x}"), "default", VALUES)
            await store.create(kind=row.kind, id=row.id, name=row.name, workspace=row.workspace, payload=row.payload)

        async def get(n: int) -> None:
            await vault.get(SandboxId(f"sb-{n:016x}"))

        async def delete(n: int) -> None:
            await store.delete(KIND_SECRETS, f"sb-{n:016x}")

        serial = itertools.count()

        async def record(_n: int) -> None:
            n = next(serial)
            await store.create(
                kind="bench-record", id=f"r-{n:016x}", name=f"r-{n}", workspace="default", payload=PAYLOAD
            )

        async def record_then_put(n: int) -> None:
            await record(n)
            await put(next(serial))

        async def record_with_put(n: int) -> None:
            await asyncio.gather(record(n), put(next(serial)))

        async def record_beside_sealed(_n: int) -> None:
            n, sealed_id = next(serial), SandboxId(f"sb-{next(serial):016x}")
            await store.create(
                kind="bench-record",
                id=f"r-{n:016x}",
                name=f"r-{n}",
                workspace="default",
                payload=PAYLOAD,
                beside=vault.sealed(sealed_id, "default", VALUES),
            )

        pairs = {
            "a record's insert alone": record,
            "insert, then the sealed row (as a create did)": record_then_put,
            "insert and the sealed row submitted together (one batch)": record_with_put,
            "insert with the sealed row beside (one statement, as a create does)": record_beside_sealed,
        }
        cold = [name for name in sync if not name.startswith(("AESGCM(key)", "secrets.", "egress.", "credentials."))]
        fresh: dict[str, Callable[[Path], object]] = {
            "first activation: the relink as part 6 left it": _relinked_as_before,
            "first activation: trust.relink": _relinked,
        }
        found: dict[str, list[float]] = {name: [] for name in fresh}
        found |= {
            name: []
            for name in [
                *sync,
                *(f"cold: {name}" for name in cold),
                "sealed row put",
                "vault.get",
                "the sealed row deleted alone",
                *pairs,
            ]
        }
        for _ in range(args.rounds):
            for name, run in sync.items():
                found[name].append(per_call_us(run, args.calls))
            for name in cold:
                found[f"cold: {name}"].append(per_cold_call_us(sync[name], max(args.calls // 10, 20)))
            found["sealed row put"].append(await per_await_us(put, args.calls))
            found["vault.get"].append(await per_await_us(get, args.calls))
            found["the sealed row deleted alone"].append(await per_await_us(delete, args.calls))
            for name, pair in pairs.items():
                batches = store.batches
                found[name].append(await per_await_us(pair, args.calls))
                found.setdefault(f"{name}: store batches per call", []).append((store.batches - batches) / args.calls)
            for name, run in fresh.items():
                found[name].append(per_fresh_member_us(run, Path(tmp) / "members", max(args.calls // 4, 50)))
        await store.aclose()
    print(
        f"secret_parts.py --calls {args.calls} --rounds {args.rounds} --dir {args.dir}; load {os.getloadavg()[0]:.1f}"
    )
    print("CPU per call, us (median of rounds; rounds):")
    for name, values in found.items():
        print(f"  {statistics.median(values):8.2f}  {name}  ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
