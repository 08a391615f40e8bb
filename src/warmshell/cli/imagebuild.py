"""`warmshell image build`: an image from a base image and setup steps, run in a fresh sandbox with
their output streamed (see `warmshell.sdk.building`). `--run` and `--copy` steps run in the order
given on the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from warmshell.cli.options import add_connection_options, global_options

__all__ = ["add_flags", "build"]


class _Steps(argparse.Action):
    """Appends `(kind, value)` to `steps`, so --run and --copy keep their command-line order."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        steps = list(getattr(namespace, "steps", None) or [])
        steps.append((self.dest, values))
        namespace.steps = steps


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `image build`."""
    parser.add_argument("--from", dest="base", required=True, metavar="IMAGE", help="the base image")
    parser.add_argument("--run", dest="run", action=_Steps, metavar="CMD", help="a shell command step (repeatable)")
    parser.add_argument(
        "--copy",
        dest="copy",
        action=_Steps,
        metavar="LOCAL:PATH",
        help="copy a local file or directory in (repeatable)",
    )
    parser.add_argument(
        "--allow-net", action="append", default=[], metavar="HOST[:PORT]", help="egress the steps may use (repeatable)"
    )
    parser.add_argument("--as", dest="tag", required=True, metavar="NAME:TAG", help="the built image's name and tag")
    parser.add_argument("--force", action="store_true", help="move the tag if it names an image already")
    parser.set_defaults(steps=[])
    add_connection_options(parser)


def _write(stream: str, chunk: bytes) -> None:
    target = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
    target.write(chunk)
    target.flush()


def build(args: argparse.Namespace) -> int:
    """Build the image; prints NAME:TAG@DIGEST last. A failed step exits 1, naming it."""
    from warmshell.cli import client
    from warmshell.sdk import building

    steps: Sequence[building.Step] = [
        building.Run(value) if kind == "run" else building.parse_copy(value) for kind, value in args.steps
    ]

    def body() -> int:
        with client.connect(global_options(args)) as sdk:
            try:
                built = sdk.build_image(
                    args.tag, base=args.base, steps=steps, allow_net=args.allow_net, force=args.force, output=_write
                )
            except building.BuildFailed as exc:
                print(f"error: image build: {exc}", file=sys.stderr)
                return 1
        print(built.pinned)
        return 0

    return client.run(body)
