"""``kubesim serve``: run the simulated API server and, in its process, the agent-sandbox
controllers and the kubelet (``kubesim.cluster.in_process``).

The controllers and kubelet reach the server through its own request handler, with its checks,
faults and log, but without HTTP: over loopback HTTP with JSON both ways they cost more CPU per warm
claim than the API server itself, and a second process's core was worth less than that cost.
``kubesim controllers`` still runs them against a server in another process, over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from kubesim.apiserver import ApiServer, ServerConfig

DEFAULT_KUBECONFIG = Path.home() / ".kube" / "kubesim.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubesim", description="A simulated Kubernetes on loopback.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the API server")
    serve.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free port)")
    serve.add_argument(
        "--kubeconfig",
        type=Path,
        default=DEFAULT_KUBECONFIG,
        help=f"where to write a kubeconfig for the default user (default: {DEFAULT_KUBECONFIG})",
    )
    serve.add_argument(
        "--admin-kubeconfig",
        type=Path,
        default=None,
        help="also write a kubeconfig with the admin (controllers') token here",
    )
    serve.add_argument(
        "--no-controllers",
        action="store_true",
        help="serve the API only; do not start the agent-sandbox controllers and kubelet",
    )
    serve.add_argument("--bookmark-interval", type=float, default=5.0, help="seconds between watch bookmarks")
    serve.add_argument(
        "--no-tls",
        action="store_true",
        help="serve plain HTTP (kubectl then sends no token and is refused; Python clients still work)",
    )
    serve.add_argument(
        "--rbac",
        action="store_true",
        help="enforce RBAC: ServiceAccount tokens get only what Roles/ClusterRoles bound to them grant "
        "(the default user and admin tokens are system:masters and keep full access)",
    )
    controllers = sub.add_parser(
        "controllers", help="run the agent-sandbox controllers and the kubelet against a served API (serve starts it)"
    )
    controllers.add_argument(
        "--admin-kubeconfig", type=Path, required=True, help="the API server's admin kubeconfig (URL, token, CA)"
    )
    controllers.add_argument(
        "--via",
        default="",
        help="send requests to this URL instead of the kubeconfig's server (serve's plain-HTTP loopback listener)",
    )
    controllers.add_argument(
        "--stop-on-stdin-eof",
        action="store_true",
        help="stop when standard input closes (serve holds it open: the controllers never outlive it)",
    )
    return parser


# Young collections every this many allocations, not CPython's 700 (see `_quiet_collector`).
GC_YOUNG_THRESHOLD = 20_000


def _quiet_collector() -> None:
    """Once started: keep what start-up built (modules, the built-in schemas, the CRDs) out of the
    cyclic collector's sight for good, and collect the young generation less often. With CPython's
    defaults the collector took ~12 % of the API server's CPU and ~11 % of the controllers' under
    warm creates: every request allocates thousands of short-lived dicts (decoded bodies, copies,
    events), and each collection of an older generation traversed every stored object again."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


async def _serve(args: argparse.Namespace) -> None:
    from kubesim import cluster  # not for `kubesim controllers`

    server = ApiServer(
        ServerConfig(
            port=args.port,
            bookmark_interval=args.bookmark_interval,
            tls=not args.no_tls,
            rbac=args.rbac,
        )
    )
    await server.start()
    components = None if args.no_controllers else asyncio.ensure_future(cluster.in_process(server).run())
    _quiet_collector()
    path = server.write_kubeconfig(args.kubeconfig)
    if args.admin_kubeconfig is not None:
        server.write_kubeconfig(args.admin_kubeconfig, admin=True)
    print(f"kubesim API server listening on {server.url}", flush=True)
    print(f"kubeconfig written to {path}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await _until_stopped_or_failed(stop, components)
    finally:
        if components is not None:
            # Before the server stops: the kubelet stops every pod process on its way out.
            components.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await components
        await server.stop()


async def _until_stopped_or_failed(stop: asyncio.Event, components: asyncio.Future[None] | None) -> None:
    """Until SIGTERM/SIGINT, or until the controllers and kubelet fail (then serve stops too: an
    API server whose pods nobody runs any more is not a cluster)."""
    stopping = asyncio.ensure_future(stop.wait())
    waited: set[asyncio.Future[Any]] = {stopping} if components is None else {stopping, components}
    done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if components is not None and components in done and not components.cancelled():
        logging.getLogger("kubesim").error("the controllers stopped: %r; stopping", components.exception())


async def _run_controllers(args: argparse.Namespace) -> None:
    from kubesim import cluster  # here only: `serve` itself is the API server alone

    _quiet_collector()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.stop_on_stdin_eof:
        fd = sys.stdin.fileno()

        def on_stdin() -> None:
            if not os.read(fd, 4096):
                loop.remove_reader(fd)
                stop.set()

        loop.add_reader(fd, on_stdin)
    task = asyncio.ensure_future(cluster.run_controllers(kubeconfig=str(args.admin_kubeconfig), via=args.via))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # a startup failure surfaces here


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args) if args.command == "serve" else _run_controllers(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
