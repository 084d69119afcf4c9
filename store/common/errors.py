"""Store error codes (Mooncake ``mooncake-store/include/types.h``), returned in every reply's ``code``.

The client maps them to the same Python return values as Mooncake, so the numbers are part of the wire API.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SHARD_INDEX_OUT_OF_RANGE = -100
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    OBJECT_NO_REPLICATION_TASK = -709
    REPLICA_NOT_FOUND = -710
    REPLICA_ALREADY_EXISTS = -711
    REPLICA_IS_GONE = -712
    REPLICA_NOT_IN_LOCAL_MEMORY = -713
    OBJECT_REPLICA_BUSY = -714
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    UNAVAILABLE_IN_CURRENT_MODE = -1011
    NOT_SUPPORTED = -1012
    TASK_NOT_FOUND = -1400
    TASK_PENDING_LIMIT_EXCEEDED = -1401


def code_name(code: int) -> str:
    """'OBJECT_NOT_FOUND(-704)' for a known code, 'UNKNOWN(-12345)' otherwise."""
    try:
        return f"{ErrorCode(code).name}({int(code)})"
    except ValueError:
        return f"UNKNOWN({int(code)})"
