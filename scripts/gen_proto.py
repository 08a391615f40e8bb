"""Generate the Python protobuf/gRPC stubs for proto/warmshell/v1 into src/warmshell/api/v1.

`python scripts/gen_proto.py [OUT_DIR]` — OUT_DIR defaults to the package directory; the
staleness test generates into a temporary directory and compares byte for byte.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = ROOT / "src" / "warmshell" / "api" / "v1"
# protoc writes imports relative to the proto root ("from warmshell.v1 import ..."); the
# stubs live inside our package, so the import prefix is rewritten.
IMPORT_FROM = "from warmshell.v1 import"
IMPORT_TO = "from warmshell.api.v1 import"


def generate(out_dir: Path) -> list[Path]:
    """Run protoc and return the generated files, written into out_dir."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "warmshell" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / "warmshell" / "v1").iterdir()):
            text = src.read_text().replace(IMPORT_FROM, IMPORT_TO)
            dest = out_dir / src.name
            dest.write_text(text)
            written.append(dest)
        (out_dir / "__init__.py").write_text('"""Generated protobuf and gRPC stubs (do not edit)."""\n')
        written.append(out_dir / "__init__.py")
    return written


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_DIR
    if out == PACKAGE_DIR and out.exists():
        shutil.rmtree(out)
    for path in generate(out):
        print(path.relative_to(out.parent) if out == PACKAGE_DIR else path)


if __name__ == "__main__":
    main()
