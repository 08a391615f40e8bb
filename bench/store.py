"""Issue 20 benchmark: the SQLite store against the Postgres store, in one run.

1. Store operations (in this process, straight on the store): create, get and compare-and-swap
   update of ~1.5 KB records, with 1 and with 16 concurrent writers, each on its own records; and a
   contended counter that every writer increments with CAS retries (latency per increment that
   landed, conflicts counted). Two clients (two would-be replicas) share each backend.
2. The gateway on each backend (a `warmshell gateway start` process on the local driver): warm and
   cold create -> Ready, sequential, so the store's share of a create shows as the difference.

Postgres is a throwaway server started as `scripts/dev-postgres` starts one (loopback, default
durability: fsync and synchronous_commit on). SQLite is the gateway's default (WAL,
synchronous=NORMAL: durable across a process crash, not a power cut), so a Postgres commit pays an
fsync that a SQLite commit does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness import gateway_process, summary, write_results
from warm_path import timed_create, wait_idle, write_profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.postgres import dev_postgres_server  # noqa: E402
from warmshell.core.config import StoreConfig  # noqa: E402
from warmshell.core.errors import ConflictError  # noqa: E402
from warmshell.gateway.store import postgres, sqlite  # noqa: E402
from warmshell.gateway.store.base import Store  # noqa: E402

PAYLOAD = json.dumps({"spec": {"environment": {f"K{i}": "v" * 20 for i in range(40)}}, "status": {"phase": "Ready"}})
WARM_ENV = {"POOL": "store-bench"}
Opener = Callable[[], Awaitable[Store]]


async def timed(samples: list[float], op: Awaitable[Any]) -> Any:
    start = time.perf_counter()
    result = await op
    samples.append((time.perf_counter() - start) * 1000)
    return result


async def store_ops(open_store: Opener, *, writers: int, per_writer: int, increments: int) -> dict[str, Any]:
    clients = [await open_store(), await open_store()]
    tag = f"c{writers}"
    creates: list[float] = []
    gets: list[float] = []
    updates: list[float] = []

    async def writer(w: int) -> None:
        store = clients[w % 2]
        for i in range(per_writer):
            oid = f"{tag}-{w}-{i}"
            row = await timed(
                creates, store.create(kind="sandbox", id=oid, name=oid, workspace="bench", payload=PAYLOAD)
            )
            await timed(gets, store.get("sandbox", oid))
            await timed(
                updates, store.update(kind="sandbox", id=oid, expected_version=row.resource_version, payload=PAYLOAD)
            )

    start = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    write_seconds = time.perf_counter() - start

    counter = f"counter-{tag}"
    await clients[0].create(kind="counter", id=counter, name=counter, workspace="bench", payload="0")
    landed: list[float] = []
    conflicts = 0

    async def increment(store: Store) -> None:
        nonlocal conflicts
        begin = time.perf_counter()
        while True:
            row = await store.get("counter", counter)
            assert row is not None
            try:
                await store.update(kind="counter", id=counter, expected_version=row.resource_version,
                                   payload=str(int(row.payload) + 1))  # fmt: skip
                break
            except ConflictError:
                conflicts += 1
        landed.append((time.perf_counter() - begin) * 1000)

    async def incrementer(w: int) -> None:
        for _ in range(increments // writers):
            await increment(clients[w % 2])

    await asyncio.gather(*(incrementer(w) for w in range(writers)))
    final = await clients[1].get("counter", counter)
    assert final is not None
    assert int(final.payload) == len(landed), "an increment was lost"
    for client in clients:
        await client.aclose()
    ops = len(creates) + len(gets) + len(updates)
    return {
        "writers": writers,
        "create_ms": summary(creates),
        "get_ms": summary(gets),
        "cas_update_ms": summary(updates),
        "ops_per_second": ops / write_seconds,
        "contended_increment_ms": summary(landed),
        "contended_conflicts": conflicts,
    }


async def gateway_creates(config_text: str, *, warm: int, cold: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ws-store-bench-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        write_profile(pools, "store-bench", warm, WARM_ENV)
        config = Path(tmp) / "gateway.toml"
        config.write_text(f"[local]\nmax_pool_replicas = {warm}\n" + config_text)
        async with gateway_process("--pools", str(pools), "--config", str(config)) as gw:
            await wait_idle(gw, "store-bench", warm, timeout=300)
            results: dict[str, Any] = {}
            for label, count, env in (("warm", warm, WARM_ENV), ("cold", cold, {"POOL": "none"})):
                client, served = [], {"warm": 0, "cold": 0}
                for i in range(count):
                    c, _, ready = await timed_create(gw, f"{label}-{i}", env)
                    client.append(c)
                    served[ready.status.allocation] += 1
                for i in range(count):
                    await gw.delete(f"{label}-{i}")
                results[label] = {"client_ms": summary(client), "served": served}
    return results


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with dev_postgres_server() as server:
        with tempfile.TemporaryDirectory(prefix="ws-store-bench-") as tmp:
            db_url = await server.create_database()

            async def open_sqlite() -> Store:
                return await sqlite.open_sqlite_store(Path(tmp) / "bench.db")

            async def open_postgres() -> Store:
                settings = StoreConfig(pool_max_size=16)
                return await postgres.open_postgres_store(db_url, password=server.password, config=settings)

            backends: dict[str, Opener] = {"sqlite": open_sqlite, "postgres": open_postgres}
            ops: dict[str, list[dict[str, Any]]] = {name: [] for name in backends}
            for writers in (1, 16):
                for name, opener in backends.items():
                    per_writer = max(1, args.ops // writers)
                    ops[name].append(await store_ops(opener, writers=writers, per_writer=per_writer,
                                                     increments=args.increments))  # fmt: skip
        gateways = {}
        if args.warm or args.cold:
            pg_url = await server.create_database()
            pg_config = f'[store]\nurl = "{pg_url}"\npassword_file = "{server.password_file}"\n'
            for name, text in (("sqlite", ""), ("postgres", pg_config)):
                gateways[name] = await gateway_creates(text, warm=args.warm, cold=args.cold)
    return {"store_ops": ops, "gateway": gateways}


def table(data: dict[str, Any]) -> str:
    out = "## Store operations (ms)\n\n| backend | writers | create p50 / p99 | get p50 / p99 | CAS update p50 / p99 "
    out += "| ops/s | contended increment p50 / p99 | conflicts |\n|---|---|---|---|---|---|---|---|\n"
    for name, runs in data["store_ops"].items():
        for r in runs:
            cells = [f"{r[k]['p50']:.2f} / {r[k]['p99']:.2f}" for k in ("create_ms", "get_ms", "cas_update_ms")]
            inc = r["contended_increment_ms"]
            out += (f"| {name} | {r['writers']} | {' | '.join(cells)} | {r['ops_per_second']:.0f} "
                    f"| {inc['p50']:.2f} / {inc['p99']:.2f} | {r['contended_conflicts']} |\n")  # fmt: skip
    out += "\nPostgres / SQLite ratio of CAS update p50: "
    out += ", ".join(
        f"{pg['writers']} writers {pg['cas_update_ms']['p50'] / sq['cas_update_ms']['p50']:.1f}x"
        for sq, pg in zip(data["store_ops"]["sqlite"], data["store_ops"]["postgres"], strict=True)
    )
    if data["gateway"]:
        out += "\n\n## Gateway create -> Ready, local driver, sequential (ms, client side)\n\n"
        out += "| backend | path | n | p50 | p90 | p99 | served |\n|---|---|---|---|---|---|---|\n"
        for name, paths in data["gateway"].items():
            for label, r in paths.items():
                s = r["client_ms"]
                figures = f"{s['n']} | {s['p50']:.2f} | {s['p90']:.2f} | {s['p99']:.2f}"
                out += f"| {name} | {label} | {figures} | {r['served']} |\n"
        sq, pg = data["gateway"]["sqlite"], data["gateway"]["postgres"]
        out += "\nPostgres - SQLite, p50: " + ", ".join(
            f"{label} {pg[label]['client_ms']['p50'] - sq[label]['client_ms']['p50']:+.2f} ms" for label in sq
        )
    return out + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=400, help="creates (and as many gets and updates) per run")
    parser.add_argument("--increments", type=int, default=160, help="contended counter increments per run")
    parser.add_argument("--warm", type=int, default=40, help="warm creates per backend (pool of that size)")
    parser.add_argument("--cold", type=int, default=20, help="cold creates per backend")
    parser.add_argument("--note", default="", help="a line about the conditions (e.g. the machine was shared)")
    args = parser.parse_args()
    data = asyncio.run(measure(args))
    data["note"] = args.note
    write_results("store", data, table(data) + (f"\n{args.note}\n" if args.note else ""))


if __name__ == "__main__":
    main()
