"""gRPC message limits shared by every server and channel of the fleet.

gRPC's default 4 MiB receive limit is below what the router accepts (16,000,000 prompt
characters, or 2,000,000 token ids), so a large but valid request failed with "message
larger than max" instead of the router's own clear limit. 80 MiB holds the largest accepted
request (16 M characters of up to 4 UTF-8 bytes, or 2 M ids of up to 5 bytes) with room for
the other fields; anything larger fails with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

MAX_GRPC_MESSAGE_BYTES = 80 * 1024 * 1024

GRPC_MESSAGE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
)
