"""``MooncakeDistributedStore``: Mooncake's Python store API (reference §2.2, §7) on top of StoreCore.

Return conventions (exactly Mooncake's): int status 0 / negative ErrorCode; ``get`` returns ``b""`` for a
missing key or any error; batch calls return one entry per key (``[]`` for ``[]``, except ``get_batch``'s
Mooncake quirk: ``[b""]`` for an empty or wholly failed batch); zero-copy reads return byte counts. Bad
input (wrong types, empty keys, mismatched batch lists, too-small buffers) is logged and answered with
INVALID_PARAMS (-600), never raised, except where Mooncake raises (TypeError from ReplicateConfig).
A call before ``setup`` (or after ``close``) logs why and fails: -1, ``b""``, ``None`` or per-key -1.

Zero-copy calls take raw addresses; they must lie inside memory given to ``register_buffer`` (or the
store's own buffers), else INVALID_PARAMS: the Transfer Engine moves data straight between that memory and
the replica's segment (a replica in this process's own segment is a memcpy).
"""

from __future__ import annotations

import logging

from mooncake.store.client.config import ReplicaStatus, ReplicateConfig
from mooncake.store.client.core import NOT_READY, OK, StoreCore, key_error, new_bytes
from mooncake.store.client.memory import buffer_address
from mooncake.store.client.tasks import TaskAPI
from mooncake.store.client.tensor import TensorAPI
from mooncake.store.master.errors import ErrorCode
from mooncake.store.proto import mooncake_master_pb2 as pb

_log = logging.getLogger("mooncake.store.client")
_INVALID = int(ErrorCode.INVALID_PARAMS)


class BufferHandle(bytes):
    """The value of ``get_buffer``: a bytes object (buffer protocol) with Mooncake's ``ptr()`` / ``size()``."""

    def ptr(self) -> int:
        return id(self) + bytes.__basicsize__ - 1

    def size(self) -> int:
        return len(self)


class MemoryDescriptor:
    def __init__(self, size: int, buffer_address: int, transport_endpoint: str) -> None:
        self.buffer_descriptor = self
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return (f"BufferDescriptor(size={self.size}, buffer_address={self.buffer_address:#x}, "
                f"transport_endpoint={self.transport_endpoint!r})")


class DiskDescriptor:
    """Where a disk replica lives: Mooncake's ``{file_path, object_size}``; for a LOCAL_DISK replica also the
    owner (``client_id``) and the endpoint that serves it (``transport_endpoint``). ``file_path`` is the
    owner's business and left empty."""

    def __init__(self, object_size: int, client_id: str = "", transport_endpoint: str = "",
                 file_path: str = "") -> None:
        self.file_path = file_path
        self.object_size = object_size
        self.client_id = client_id
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return (f"DiskDescriptor(object_size={self.object_size}, client_id={self.client_id!r}, "
                f"transport_endpoint={self.transport_endpoint!r})")


class ReplicaDescriptor:
    """One replica of an object (``get_replica_desc``): a memory replica, or a LOCAL_DISK one (a file in the
    SSD tier of client ``client_id``, served at ``transport_endpoint``)."""

    def __init__(self, rep) -> None:
        self.status = ReplicaStatus(rep.status)
        self.segment_name = rep.segment_name
        self._local_disk = rep.type == pb.REPLICA_TYPE_LOCAL_DISK
        if self._local_disk:
            self._mem = None
            self._disk = DiskDescriptor(rep.size, rep.client_id, rep.transport_endpoint)
        else:
            self._mem = MemoryDescriptor(rep.size, rep.address, rep.transport_endpoint)
            self._disk = None

    def is_memory_replica(self) -> bool:
        return not self._local_disk

    def is_disk_replica(self) -> bool:
        return False  # Mooncake's shared-FS replicas; this store's disk replicas are LOCAL_DISK

    def is_local_disk_replica(self) -> bool:
        return self._local_disk

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if self._mem is None:
            raise RuntimeError("not a memory replica")
        return self._mem

    def get_disk_descriptor(self) -> DiskDescriptor:
        if self._disk is None:
            raise RuntimeError("not a disk replica")
        return self._disk

    get_local_disk_descriptor = get_disk_descriptor

    def __repr__(self) -> str:
        if self._local_disk:
            return f"ReplicaDescriptor(status={self.status.name}, LOCAL_DISK, {self._disk})"
        return f"ReplicaDescriptor(status={self.status.name}, segment={self.segment_name!r}, {self._mem})"


def _values(parts, op: str):
    """[(addr, len)] of buffer-protocol parts, or None (logged) for a bad one."""
    out = []
    try:
        for p in parts:
            out.append(buffer_address(p))
    except TypeError as e:
        _log.error("%s: %s", op, e)
        return None
    return out


def _same_len(op: str, *lists) -> bool:
    try:
        n = {len(x) for x in lists}
    except TypeError:
        _log.error("%s: arguments must be lists", op)
        return False
    if len(n) != 1:
        _log.error("%s: list arguments differ in length (%s)", op, ", ".join(str(len(x)) for x in lists))
        return False
    return True


class MooncakeDistributedStore(TensorAPI, TaskAPI, StoreCore):
    # -- bytes: writes -----------------------------------------------------------------------------------------
    def put(self, key, value, config: ReplicateConfig | None = None) -> int:
        return self._put_parts("put", key, (value,), config, upsert=False)

    def put_parts(self, key, *parts, config: ReplicateConfig | None = None) -> int:
        return self._put_parts("put_parts", key, parts, config, upsert=False)

    def upsert(self, key, value, config: ReplicateConfig | None = None) -> int:
        return self._put_parts("upsert", key, (value,), config, upsert=True)

    def upsert_parts(self, key, *parts, config: ReplicateConfig | None = None) -> int:
        return self._put_parts("upsert_parts", key, parts, config, upsert=True)

    def _put_parts(self, op: str, key, parts, config, upsert: bool) -> int:
        if not self._ready(op):
            return NOT_READY
        if not self._local[1]:
            _log.error("%s: local_buffer_size is 0 (pure server): byte puts are not available", op)
            return _INVALID
        regions = _values(parts, op)
        if regions is None:
            return _INVALID
        return self.put_many([key], [regions], False, config, upsert)[0]

    def put_batch(self, keys, values, config: ReplicateConfig | None = None) -> int:
        return self._put_batch("put_batch", keys, values, config, upsert=False)

    def upsert_batch(self, keys, values, config: ReplicateConfig | None = None) -> int:
        return self._put_batch("upsert_batch", keys, values, config, upsert=True)

    def _put_batch(self, op: str, keys, values, config, upsert: bool) -> int:
        if not self._ready(op):
            return NOT_READY
        if not _same_len(op, keys, values):
            return _INVALID
        if not keys:
            return OK
        regions = _values(values, op)
        if regions is None:
            return _INVALID
        codes = self.put_many(list(keys), [[r] for r in regions], False, config, upsert)
        return next((c for c in codes if c != OK), OK)

    # -- bytes: reads ------------------------------------------------------------------------------------------
    def get(self, key, /) -> bytes:
        return self._get_bytes("get", [key], bytes)[0] or b""

    def get_buffer(self, key, /) -> BufferHandle | None:
        return self._get_bytes("get_buffer", [key], BufferHandle)[0]

    def get_batch(self, keys, /) -> list[bytes]:
        out = self._get_bytes("get_batch", keys, bytes)
        if not out or all(v is None for v in out):
            return [b""]  # Mooncake's quirk for an empty or wholly failed batch
        return [v or b"" for v in out]

    def batch_get_buffer(self, keys, /) -> list:
        return self._get_bytes("batch_get_buffer", keys, BufferHandle)

    def _get_bytes(self, op: str, keys, kind) -> list:
        """Per key a new `kind` (bytes / BufferHandle) holding the value, or None."""
        if not self._ready(op):
            return [None] * (len(keys) if isinstance(keys, (list, tuple)) else 1)
        if not isinstance(keys, (list, tuple)):
            _log.error("%s: keys must be a list", op)
            return [None]
        keys = list(keys)
        for k in keys:
            why = key_error(k)
            if why:
                _log.error("%s: %s", op, why)
                return [None] * len(keys)
        out: list = [None] * len(keys)

        def dest(i: int, size: int):
            b, addr = new_bytes(size) if kind is bytes else _new_handle(size)
            out[i] = b
            return [(addr, size)]
        if len(keys) == 1:
            r = self.fast_read(keys[0], dest, registered=False)
            if r is not None:
                return [out[0] if r >= 0 else None]
        results = self.get_many(keys, dest, registered=False)
        return [out[i] if r >= 0 else None for i, r in enumerate(results)]

    def get_size(self, key, /) -> int:
        if not self._ready("get_size"):
            return NOT_READY
        why = key_error(key)
        if why:
            _log.error("get_size: %s", why)
            return _INVALID
        e = self._lookup([key])[0]
        return e if isinstance(e, int) else e.size

    def is_exist(self, key, /) -> int:
        return self._exist("is_exist", [key])[0]

    def batch_is_exist(self, keys) -> list[int]:
        return self._exist("batch_is_exist", keys)

    def _exist(self, op: str, keys) -> list[int]:
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        keys = list(keys)
        if not keys:
            return []
        if any(key_error(k) for k in keys):
            _log.error("%s: %s", op, next(key_error(k) for k in keys if key_error(k)))
            return [-1 if len(keys) > 1 else _INVALID] * len(keys)
        reply = self._rpc("BatchExistKey", keys=keys)
        if isinstance(reply, int):
            return [reply if len(keys) == 1 else -1] * len(keys)
        out = []
        for r in reply.results:
            if r.code == OK:
                out.append(1 if r.exists else 0)
            elif r.code == ErrorCode.OBJECT_NOT_FOUND:
                out.append(0)
            else:
                out.append(r.code if len(keys) == 1 else -1)
        return out

    # -- removal -----------------------------------------------------------------------------------------------
    def remove(self, key, force: bool = False) -> int:
        if not self._ready("remove"):
            return NOT_READY
        why = key_error(key)
        if why:
            _log.error("remove: %s", why)
            return _INVALID
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys, force: bool = False) -> list[int]:
        if not self._ready("batch_remove"):
            return [NOT_READY] * len(keys)
        keys = list(keys)
        if not keys:
            return []
        for k in keys:
            why = key_error(k)
            if why:
                _log.error("remove: %s", why)
                return [_INVALID] * len(keys)
        self._cache_drop(keys)
        reply = self._rpc("BatchRemove", keys=keys, force=bool(force))
        codes = [reply] * len(keys) if isinstance(reply, int) else list(reply.codes)
        if OK in codes:
            self._disk_drops_soon()
        return codes

    def remove_by_regex(self, regex_pattern, force: bool = False) -> int:
        if not self._ready("remove_by_regex"):
            return NOT_READY
        if not isinstance(regex_pattern, str):
            _log.error("remove_by_regex: the pattern must be a str")
            return _INVALID
        self.cache_clear()
        reply = self._rpc("RemoveByRegex", pattern=regex_pattern, force=bool(force))
        self._disk_drops_soon()
        return reply if isinstance(reply, int) else (reply.code or reply.count)

    def remove_all(self, force: bool = False) -> int:
        if not self._ready("remove_all"):
            return NOT_READY
        self.cache_clear()
        reply = self._rpc("RemoveAll", force=bool(force))
        self._disk_drops_soon()
        return reply if isinstance(reply, int) else (reply.code or reply.count)

    # -- zero copy ---------------------------------------------------------------------------------------------
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Registers [buffer_ptr, buffer_ptr+size) for zero-copy calls. Registering overlapping memory fails."""
        if not self._ready("register_buffer"):
            return NOT_READY
        if not _is_int(buffer_ptr) or not _is_int(size) or buffer_ptr <= 0 or size <= 0:
            _log.error("register_buffer: buffer_ptr and size must be positive ints")
            return _INVALID
        if not self._ranges.add(buffer_ptr, size):
            _log.error("register_buffer: [%#x, +%d) overlaps memory already registered", buffer_ptr, size)
            return _INVALID
        rc = self._engine.register_memory(buffer_ptr, size)
        if rc != 0:
            self._ranges.remove(buffer_ptr)
            return _INVALID
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        if not self._ready("unregister_buffer"):
            return NOT_READY
        if not _is_int(buffer_ptr) or self._ranges.remove(buffer_ptr) is None:
            _log.error("unregister_buffer: %r was not registered with register_buffer", buffer_ptr)
            return _INVALID
        return OK if self._engine.unregister_memory(buffer_ptr) == 0 else _INVALID

    def _regions_ok(self, op: str, ptrs, sizes) -> bool:
        for p, n in zip(ptrs, sizes):
            if not _is_int(p) or not _is_int(n) or n < 0:
                _log.error("%s: buffer pointers and sizes must be non-negative ints", op)
                return False
            if n and not self._ranges.contains(p, n):
                _log.error("%s: [%#x, +%d) is not inside a registered buffer (register_buffer first)", op, p, n)
                return False
        return True

    def put_from(self, key, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        return self._put_from("put_from", [key], [[buffer_ptr]], [[size]], config, False)[0]

    def upsert_from(self, key, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        return self._put_from("upsert_from", [key], [[buffer_ptr]], [[size]], config, True)[0]

    def put_from_with_metadata(self, key, buffer_ptr: int, metadata_buffer_ptr: int, size: int,
                               metadata_size: int, config: ReplicateConfig | None = None) -> int:
        """Stores [metadata][data] as one object."""
        return self._put_from("put_from_with_metadata", [key], [[metadata_buffer_ptr, buffer_ptr]],
                              [[metadata_size, size]], config, False)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config: ReplicateConfig | None = None) -> list[int]:
        return self._batch_from("batch_put_from", keys, buffer_ptrs, sizes, config, False)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config: ReplicateConfig | None = None) -> list[int]:
        return self._batch_from("batch_upsert_from", keys, buffer_ptrs, sizes, config, True)

    def _batch_from(self, op, keys, ptrs, sizes, config, upsert) -> list[int]:
        if not _same_len(op, keys, ptrs, sizes):
            return [_INVALID] * len(keys)
        return self._put_from(op, list(keys), [[p] for p in ptrs], [[s] for s in sizes], config, upsert)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     config: ReplicateConfig | None = None) -> list[int]:
        """Object keys[i] = concatenation of the buffers all_buffer_ptrs[i][j] (all_sizes[i][j] bytes)."""
        op = "batch_put_from_multi_buffers"
        if not _same_len(op, keys, all_buffer_ptrs, all_sizes) or \
                not all(_same_len(op, p, s) for p, s in zip(all_buffer_ptrs, all_sizes)):
            return [_INVALID] * len(keys)
        return self._put_from(op, list(keys), all_buffer_ptrs, all_sizes, config, False)

    def _put_from(self, op, keys, ptr_lists, size_lists, config, upsert) -> list[int]:
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        if not keys:
            return []
        if not all(self._regions_ok(op, p, s) for p, s in zip(ptr_lists, size_lists)):
            return [_INVALID] * len(keys)
        sources = [list(zip(p, s)) for p, s in zip(ptr_lists, size_lists)]
        return self.put_many(keys, sources, True, config, upsert)

    def get_into(self, key, buffer_ptr: int, size: int) -> int:
        r = self.fast_get_into(key, buffer_ptr, size)
        if r is not None:
            return r
        return self._get_into("get_into", [key], [[buffer_ptr]], [[size]])[0]

    def batch_get_into(self, keys, buffer_ptrs, sizes) -> list[int]:
        if not _same_len("batch_get_into", keys, buffer_ptrs, sizes):
            return [_INVALID] * len(keys)
        return self._get_into("batch_get_into", list(keys), [[p] for p in buffer_ptrs], [[s] for s in sizes])

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Scatters object keys[i] over its buffers in order; bytes read per key or negative."""
        op = "batch_get_into_multi_buffers"
        if not _same_len(op, keys, all_buffer_ptrs, all_sizes) or \
                not all(_same_len(op, p, s) for p, s in zip(all_buffer_ptrs, all_sizes)):
            return [_INVALID] * len(keys)
        return self._get_into(op, list(keys), all_buffer_ptrs, all_sizes)

    def _get_into(self, op, keys, ptr_lists, size_lists) -> list[int]:
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        if not keys:
            return []
        results = [OK] * len(keys)
        for i, k in enumerate(keys):
            why = key_error(k)
            if why or not self._regions_ok(op, ptr_lists[i], size_lists[i]):
                if why:
                    _log.error("%s: %s", op, why)
                results[i] = _INVALID
        idx = [i for i in range(len(keys)) if results[i] == OK]
        if len(idx) == 1 == len(keys):
            r = self.fast_read(keys[0], lambda j, size: list(zip(ptr_lists[0], size_lists[0])), registered=True)
            if r is not None:
                return [r]
        got = self.get_many([keys[i] for i in idx],
                            lambda j, size: list(zip(ptr_lists[idx[j]], size_lists[idx[j]])), registered=True)
        for i, r in zip(idx, got):
            results[i] = r
        return results

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes) -> list:
        """results[i][j][k]: bytes copied from object all_keys[i][j] at all_src_offsets[i][j][k] into
        buffer_ptrs[i] + all_dst_offsets[i][j][k] (all_sizes[i][j][k] bytes), or a negative code for that
        fragment alone (shape mismatch, source range past the object, unregistered destination, missing
        key). The destination buffers must be registered."""
        op = "get_into_ranges"
        if not self._ready(op):
            return [[[NOT_READY]] for _ in buffer_ptrs]
        if not _same_len(op, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes):
            return [[[_INVALID]] for _ in buffer_ptrs]
        results, flat_keys, where = [], [], []
        for i, keys in enumerate(all_keys):
            row = []
            shape_ok = _same_len(op, keys, all_dst_offsets[i], all_src_offsets[i], all_sizes[i])
            for j, key in enumerate(keys):
                if not shape_ok or not _same_len(op, all_dst_offsets[i][j], all_src_offsets[i][j],
                                                 all_sizes[i][j]) or key_error(key):
                    row.append([_INVALID] * (len(all_sizes[i][j]) if shape_ok else 1))
                    continue
                row.append([0] * len(all_sizes[i][j]))
                flat_keys.append(key)
                where.append((i, j))
            results.append(row)
        entries = self._lookup(flat_keys)
        ops = []
        for (i, j), key, e in zip(where, flat_keys, entries):
            for k, (dst, src, n) in enumerate(zip(all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j])):
                if isinstance(e, int):
                    results[i][j][k] = e
                elif not e.replicas:  # ranged reads need a memory replica (as in Mooncake)
                    results[i][j][k] = int(ErrorCode.INVALID_REPLICA)
                elif src < 0 or n < 0 or src + n > e.size:
                    results[i][j][k] = int(ErrorCode.BUFFER_OVERFLOW)
                elif not self._ranges.contains(buffer_ptrs[i] + dst, n) or dst < 0:
                    results[i][j][k] = _INVALID
                else:
                    rep = min(e.replicas, key=lambda r: r.segment_name != self._segment_name)
                    ops.append((rep.segment_name, buffer_ptrs[i] + dst, rep.address + src, n, (i, j, k)))
                    results[i][j][k] = n
        for i, j, k in self._transfer(ops, write=False):
            results[i][j][k] = int(ErrorCode.TRANSFER_FAIL)
        return results

    # -- introspection -----------------------------------------------------------------------------------------
    def get_replica_desc(self, key) -> list[ReplicaDescriptor]:
        return self.batch_get_replica_desc([key]).get(key, [])

    def batch_get_replica_desc(self, keys) -> dict:
        if not self._ready("batch_get_replica_desc") or not keys:
            return {}
        out = {}
        for k, e in zip(keys, self._lookup(list(keys))):
            out[k] = [] if isinstance(e, int) else [ReplicaDescriptor(r) for r in (*e.replicas, *e.disk)]
        return out

    def batch_replica_clear(self, keys, segment_name: str = "") -> list[str]:
        """Clears keys this client wrote whose lease expired (only replicas on `segment_name` if given)."""
        if not self._ready("batch_replica_clear") or not keys:
            return []
        self._cache_drop(keys)
        reply = self._rpc("BatchReplicaClear", keys=list(keys), segment_name=segment_name)
        return [] if isinstance(reply, int) else list(reply.cleared_keys)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _new_handle(size: int):
    h = BufferHandle(new_bytes(size)[0])  # a copy of uninitialised memory: refilled below
    return h, h.ptr()
