"""Wire-level limits and enums the master and its clients agree on."""

from __future__ import annotations

import enum

MAX_REPLICA_NUM = 64
# Keys are non-empty UTF-8 strings of at most this many bytes (master and clients; integrations build long
# keys from model names, hashes and ranks). A batch request carries all its keys: within MAX_REQUEST_BYTES
# that is about a thousand keys of the maximum length (the usual keys of a few hundred bytes: ~100 000).
MAX_KEY_BYTES = 64 << 10
# gRPC options shared by the master and its clients: large batches must not hit the 4 MiB default.
MAX_MESSAGE_BYTES = 256 << 20
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
# The largest request the master takes through either door (gRPC, fast_rpc), like the engine's
# MC_TCP_MAX_FRAME; replies may be larger (MAX_MESSAGE_BYTES). A larger request is refused, not buffered.
MAX_REQUEST_BYTES = 64 << 20


class ReplicaStatus(enum.IntEnum):
    """Mooncake's replica states; the values match store/proto (REPLICA_STATUS_*)."""
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5
