"""Generates the Python stubs in diffusion/v1/ from proto/diffusion/v1/*.proto.

The one command behind `make stubs`; tests/test_stubs_in_sync.py runs it into a
temporary folder and fails when the committed stubs differ. Never edit the output.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_INIT = '"""Generated from proto/diffusion by tools/gen_stubs.py. Do not edit."""\n'


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / "diffusion" / "v1").glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Writes diffusion/__init__.py, diffusion/v1/__init__.py and the stubs under out_root."""
    from grpc_tools import protoc
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in proto_files()],
    ]
    # protoc resolves the relative file names against the -I roots; run from the proto root.
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for pkg in (out_root / "diffusion", out_root / "diffusion" / "v1"):
        (pkg / "__init__.py").write_text(PACKAGE_INIT)
    return sorted(p for p in (out_root / "diffusion").rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write diffusion/ under")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
