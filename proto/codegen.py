"""Generate the Python gRPC code from the .proto files of this folder.

The generated `*_pb2*.py` files are committed: `kvfleet proto` / `python -m kvfleet.proto`
regenerates them in the source tree after a `.proto` changes (needs the `dev` extra's
grpcio-tools), and a test compares them with a fresh generation. Generation runs in a temporary
tree laid out as `kvfleet/proto/*.proto`, so the generated imports are package-qualified
(`from kvfleet.proto import common_pb2`), and each file lands by an atomic rename, so two
processes that generate at once both leave complete files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PACKAGE_PATH = Path("kvfleet") / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


class ProtoGenerationError(RuntimeError):
    """protoc rejected the .proto files, or the output could not be written."""


def proto_sources(proto_dir: Path = PROTO_DIR) -> list[Path]:
    """The .proto files of the package, sorted by name."""
    return sorted(proto_dir.glob("*.proto"))


def generated_paths(source: Path) -> list[Path]:
    """The files generated from one .proto file."""
    return [source.with_name(source.stem + suffix) for suffix in GENERATED_SUFFIXES]


def generate(proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Run protoc on every .proto of `proto_dir`; returns the files written."""
    from grpc_tools import protoc  # heavy: only when generating

    sources = proto_sources(proto_dir)
    if not sources:
        raise ProtoGenerationError(f"no .proto files in {proto_dir}")
    with tempfile.TemporaryDirectory(prefix="kvfleet-protoc-") as tmp:
        tree = Path(tmp) / "src"
        out = Path(tmp) / "out"
        (tree / PACKAGE_PATH).mkdir(parents=True)
        (out / PACKAGE_PATH).mkdir(parents=True)
        for source in sources:
            shutil.copy2(source, tree / PACKAGE_PATH / source.name)
        well_known = Path(protoc.__file__).resolve().parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{tree}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *[str(PACKAGE_PATH / source.name) for source in sources],
        ]
        status = protoc.main(args)
        if status != 0:
            raise ProtoGenerationError(f"protoc exited with status {status} on {proto_dir}")
        return [_install(path, proto_dir) for path in sorted((out / PACKAGE_PATH).iterdir())]


def _install(generated: Path, proto_dir: Path) -> Path:
    """Move one generated file into place by write-to-temp and rename (atomic on POSIX)."""
    target = proto_dir / generated.name
    fd, tmp_name = tempfile.mkstemp(prefix=f".{generated.name}.", dir=proto_dir)
    with os.fdopen(fd, "wb") as tmp_file:
        tmp_file.write(generated.read_bytes())
    os.replace(tmp_name, target)
    return target
