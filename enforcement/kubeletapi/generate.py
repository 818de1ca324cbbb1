"""Generate the Python gRPC stubs of the kubelet APIs from ``protos/*.proto`` (build time).

``make`` runs ``python -m enforcement.kubeletapi.generate`` after installing the pinned
grpcio-tools; the outputs (``protos/*_pb2*.py``, ``*.pyi``) are build products, not sources.
A stamp file records the hash of the ``.proto`` files, so a stale stub set is regenerated.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

PROTOS = Path(__file__).resolve().parent / "protos"
ROOT = PROTOS.parents[2]  # imports in the stubs are then `enforcement.kubeletapi.protos.x_pb2`
STAMP = PROTOS / ".generated"


def sources_hash() -> str:
    """sha256 over the proto files, in name order: what the stubs were generated from."""
    digest = hashlib.sha256()
    for proto in sorted(PROTOS.glob("*.proto")):
        digest.update(proto.name.encode() + b"\0" + proto.read_bytes())
    return digest.hexdigest()


def up_to_date() -> bool:
    return STAMP.is_file() and STAMP.read_text().strip() == sources_hash()


def generate() -> None:
    """Run protoc (from grpcio-tools) over every proto file; raises RuntimeError on failure."""
    from grpc_tools import protoc  # a build-time dependency only

    include = Path(protoc.__file__).resolve().parent / "_proto"  # well-known types
    protos = sorted(str(p.relative_to(ROOT)) for p in PROTOS.glob("*.proto"))
    args = ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={ROOT}", f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}", *protos]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(protos)}")
    STAMP.write_text(sources_hash() + "\n")


def main() -> int:
    if up_to_date():
        return 0
    try:
        generate()
    except (ImportError, RuntimeError) as e:
        print(f"enforcement.kubeletapi.generate: {e}", file=sys.stderr)
        return 1
    print(f"generated kubelet API stubs in {PROTOS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
