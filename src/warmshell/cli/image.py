"""`warmshell image import|list|inspect|rm|prune`: the local driver's image store, through the
SDK's `client.images` (a layout directory is sent as a tar; `import` shows a progress bar on a
terminal for sources over a few MiB)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from warmshell.cli import imagebuild
from warmshell.cli.errors import inert
from warmshell.cli.options import Subcommands, add_connection_options, add_output_option, global_options, output_is_json

if TYPE_CHECKING:
    from warmshell.api.v1 import image_pb2
    from warmshell.sdk.images import ImportProgress

__all__ = ["register"]

# Smaller sources import in well under a second: a bar would only flicker.
_BAR_FROM_BYTES = 8 << 20
_BAR_WIDTH = 30


def register(commands: Any, *, chosen: str | None) -> None:
    """Add `image` to the root parser's subcommands, with the flags of the `chosen` one."""
    sub = Subcommands(commands, "image", "manage the local driver's images", chosen=chosen)
    importing = sub.add(
        "import",
        _import,
        "Import an image: an OCI image layout directory, an OCI archive, or a docker save tarball. "
        "Prints the image's digest.",
    )
    if importing is not None:
        importing.add_argument("source", help="OCI layout directory, OCI archive or docker save tarball")
        importing.add_argument("--name", default="", help="NAME[:TAG] to tag it with (default: the source's tags)")
        importing.add_argument(
            "--platform", default="", help="OS/ARCH of a multi-platform source (default: this host's)"
        )
        add_connection_options(importing)
    listing = sub.add("list", _list, "List images: name, tag, digest, size, layers, created.")
    if listing is not None:
        add_output_option(listing)
        add_connection_options(listing)
    inspecting = sub.add(
        "inspect", _inspect, "Show an image: its config (env, entrypoint, cmd, workdir, user, labels) and layers."
    )
    if inspecting is not None:
        inspecting.add_argument("ref", help="NAME[:TAG], NAME@sha256:..., or a digest")
        add_output_option(inspecting)
        add_connection_options(inspecting)
    removing = sub.add(
        "rm", _remove, "Remove images: a NAME:TAG untags (the image goes with its last tag); a digest removes."
    )
    if removing is not None:
        removing.add_argument("refs", nargs="+", metavar="REF", help="NAME[:TAG] or digest")
        add_connection_options(removing)
    building = sub.add(
        "build",
        imagebuild.build,
        "Build an image: a fresh sandbox of --from runs the --run and --copy steps in order (their output "
        "streamed; the first that fails ends the build, naming it), then is snapshotted as --as.",
    )
    if building is not None:
        imagebuild.add_flags(building)
    pruning = sub.add("prune", _prune, "Remove untagged images and the layers no image uses.")
    if pruning is not None:
        add_connection_options(pruning)


class _Bar:
    """A one-line progress bar on stderr, redrawn in place."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, progress: ImportProgress) -> None:
        if progress.total_bytes < _BAR_FROM_BYTES:
            return
        fraction = min(1.0, progress.done_bytes / progress.total_bytes)
        filled = int(fraction * _BAR_WIDTH)
        layers = f" layer {progress.layers_done}/{progress.layers}" if progress.layers else ""
        line = f"\r{progress.stage:<9} [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {fraction:4.0%}{layers}"
        sys.stderr.write(line)
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


def _import(args: argparse.Namespace) -> int:
    from warmshell.cli import client

    def body() -> int:
        bar = _Bar() if sys.stderr.isatty() else None
        try:
            with client.connect(global_options(args)) as sdk:
                image = sdk.images.import_(args.source, name=args.name, platform=args.platform, progress=bar)
        finally:
            if bar is not None:
                bar.close()
        print(image.digest)
        return 0

    return client.run(body)


def _rows(images: list[image_pb2.Image]) -> list[list[str]]:
    from warmshell.cli import render

    rows = []
    for image in images:
        short = image.digest.removeprefix("sha256:")[:12]
        created = image.created[:19].replace("T", " ") or "-"
        for name in image.names or ["<none>:<none>"]:
            repo, _, tag = name.rpartition(":")
            rows.append([repo, tag, short, render.format_bytes(image.size), str(len(image.layers)), created])
    return rows


def _list(args: argparse.Namespace) -> int:
    from warmshell.cli import client

    as_json = output_is_json(args)

    def body() -> int:
        from warmshell.cli import render

        with client.connect(global_options(args)) as sdk:
            response = sdk.images.list_response()
        if as_json:
            print(render.to_json(response))
        else:
            headers = ["NAME", "TAG", "DIGEST", "SIZE", "LAYERS", "CREATED"]
            print(inert(render.table(headers, _rows(list(response.images)), right=frozenset({3, 4})), limit=None))
        return 0

    return client.run(body)


def _details(image: image_pb2.Image) -> str:
    from warmshell.cli import render

    config = image.config
    lines = [
        f"Digest:      {image.digest}",
        f"Names:       {', '.join(image.names) or '<none>'}",
        f"Platform:    {image.platform}",
        f"Created:     {image.created or '-'}",
        f"Size:        {render.format_bytes(image.size)}",
        f"Entrypoint:  {list(config.entrypoint)}",
        f"Cmd:         {list(config.cmd)}",
        f"WorkingDir:  {config.working_dir or '-'}",
        f"User:        {config.user or '-'}",
        "Env:",
        *(f"  {e}" for e in config.env),
        "Labels:",
        *(f"  {k}={v}" for k, v in sorted(config.labels.items())),
        "Layers:",
        *(f"  {layer.digest}  {render.format_bytes(layer.size)}" for layer in image.layers),
    ]
    if image.source_sandbox:
        lines += [f"Snapshot of: {image.source_sandbox}", f"Base:        {image.base_digest}"]
    return "\n".join(lines)


def _inspect(args: argparse.Namespace) -> int:
    from warmshell.cli import client

    as_json = output_is_json(args)

    def body() -> int:
        from warmshell.cli import render

        with client.connect(global_options(args)) as sdk:
            image = sdk.images.get_message(args.ref)
        print(render.to_json(image) if as_json else inert(_details(image), limit=None))
        return 0

    return client.run(body)


def _remove(args: argparse.Namespace) -> int:
    from warmshell.cli import client

    def body() -> int:
        with client.connect(global_options(args)) as sdk:
            for ref in args.refs:
                removed = sdk.images.remove(ref)
                print(f"untagged {ref}" if not removed else "\n".join(f"removed {d}" for d in removed))
        return 0

    return client.run(body)


def _prune(args: argparse.Namespace) -> int:
    from warmshell.cli import client

    def body() -> int:
        with client.connect(global_options(args)) as sdk:
            removed = sdk.images.prune()
        print("\n".join(f"removed {d}" for d in removed) or "nothing to prune")
        return 0

    return client.run(body)
