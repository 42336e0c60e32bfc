"""gRPC contracts (.proto) and the Python code generated from them.

Importing this package generates the `*_pb2*.py` modules when they are missing or older than
their `.proto` (see `kvfleet.proto.codegen`), so a fresh clone needs only `pip install -e .`.
"""

from kvfleet.proto.codegen import ensure_generated

ensure_generated()
