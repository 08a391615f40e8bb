"""``kubesim serve``: run the simulated API server (and, if present, the part-2 controllers)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import logging
import signal
import sys
from pathlib import Path

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
    return parser


async def _serve(args: argparse.Namespace) -> None:
    server = ApiServer(
        ServerConfig(port=args.port, bookmark_interval=args.bookmark_interval, tls=not args.no_tls, rbac=args.rbac)
    )
    await server.start()
    path = server.write_kubeconfig(args.kubeconfig)
    if args.admin_kubeconfig is not None:
        server.write_kubeconfig(args.admin_kubeconfig, admin=True)
    print(f"kubesim API server listening on {server.url}", flush=True)
    print(f"kubeconfig written to {path}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    controllers: asyncio.Task[object] | None = None
    if not args.no_controllers:
        controllers = _start_controllers(server, args)
    try:
        await stop.wait()
    finally:
        if controllers is not None:
            controllers.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await controllers
        await server.stop()


def _start_controllers(server: ApiServer, args: argparse.Namespace) -> asyncio.Task[object] | None:
    # kubesim.cluster (part 2) is optional: the CLI must work before it exists.
    if importlib.util.find_spec("kubesim.cluster") is None:
        logging.getLogger("kubesim").warning("kubesim.cluster not available; serving the API only")
        return None
    cluster = importlib.import_module("kubesim.cluster")
    admin_config = args.kubeconfig.with_name(args.kubeconfig.stem + "-admin" + args.kubeconfig.suffix)
    server.write_kubeconfig(admin_config, admin=True)
    coro = cluster.run_controllers(url=server.url, token=server.admin_token, kubeconfig=str(admin_config))
    task: asyncio.Task[object] = asyncio.ensure_future(coro)
    return task


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    if args.command == "serve":
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
