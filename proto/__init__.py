"""gRPC contracts (.proto) and the Python code generated from them.

The generated `*_pb2*.py` files are committed next to their `.proto` and packaged with it, so
importing this package never writes (images run on a read-only site-packages). After editing a
`.proto`, `kvfleet proto` regenerates them; a test fails while they are stale.
"""
