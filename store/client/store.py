"""``MooncakeDistributedStore``: Mooncake's Python store API (reference §2.2, §7) on top of StoreCore.

Return conventions (Mooncake's): int status 0 / negative ErrorCode; ``get`` returns ``b""`` for a missing
key or any error; zero-copy reads return byte counts. Every batch call returns exactly one entry per key
given, in order, duplicates included (``[]`` for ``[]``; ``get_batch`` too, where Mooncake answers ``[b""]``
for an empty or wholly failed batch); ``get_into_ranges`` answers per buffer, key and fragment.
Wrong Python types raise TypeError, as Mooncake's bindings do, whether or not the store is set up, and
change nothing (validate.py says which types each kind of argument takes). Bad values of the right type
(empty keys, keys over MAX_KEY_BYTES = 64 KiB of UTF-8, mismatched batch lists, too-small or unregistered
buffers) are logged and answered with INVALID_PARAMS (-600).
A call before ``setup`` (or after ``close``) logs why and fails: -1, ``b""``, ``None`` or per-key -1.

Zero-copy calls take raw addresses; they must lie inside memory given to ``register_buffer`` (or the
store's own buffers), else INVALID_PARAMS: the Transfer Engine moves data straight between that memory and
the replica's segment (a replica in this process's own segment is a memcpy).
"""

from __future__ import annotations

import logging

from mooncake.store.client.config import ReplicaStatus, ReplicateConfig, SetupConfig
from mooncake.store.client.core import NOT_READY, OK, StoreCore, new_bytes
from mooncake.store.client.guard import same_len as _same_len
from mooncake.store.client.memory import buffer_address
from mooncake.store.client.sessions import SessionAPI
from mooncake.store.client.tasks import TaskAPI
from mooncake.store.client.tensor import TensorAPI
from mooncake.store.client.validate import (CONFIG, FLAG, INT, KEY, KEYS, SIZE, STR, UINT, VALUE, key_error, seq,
                                            typed)
from mooncake.store.common.errors import ErrorCode
from mooncake.store.proto import mooncake_master_pb2 as pb

_log = logging.getLogger("mooncake.store.client")
_INVALID = int(ErrorCode.INVALID_PARAMS)
_OVERLAPPED = -7  # Transfer Engine: the range overlaps a registration


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
    """[(addr, len)] of buffer-protocol parts, or None (logged) for a non-contiguous one."""
    out = []
    try:
        for p in parts:
            out.append(buffer_address(p))
    except TypeError as e:
        _log.error("%s: %s", op, e)
        return None
    return out


def _valid(op: str, keys: list) -> list[int]:
    """The indices of the valid keys; why each other one is not is logged."""
    good = []
    for i, k in enumerate(keys):
        why = key_error(k)
        if why is None:
            good.append(i)
        else:
            _log.error("%s: %s", op, why)
    return good


_PTRS = seq(UINT)
_PTR_LISTS = seq(_PTRS)
_RANGES = seq(seq(seq(INT)))


class MooncakeDistributedStore(SessionAPI, TensorAPI, TaskAPI, StoreCore):
    # -- lifecycle ---------------------------------------------------------------------------------------------
    def setup(self, *args, **kwargs) -> int:
        """Positional or dict form (reference §2.2). 0, or a negative code with the reason logged; TypeError
        for wrong types or a wrong call shape (SetupConfig.check_types), even on a store already set up.
        The 8th positional (or `engine=`) shares a Transfer Engine: see SetupConfig and core.py."""
        SetupConfig.check_types(args, kwargs)
        return super().setup(*args, **kwargs)

    @typed(mem_pool_size=SIZE, local_buffer_size=SIZE, server_address=STR)
    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address) -> int:
        """A client of the store that the ``mooncake_client`` at `server_address` ("host:port", its --port)
        serves, without a segment of its own, with `mem_pool_size` bytes of registered memory for
        alloc_from_mem_pool and a `local_buffer_size` staging buffer (sizes: ints or strings like "16MB").
        0, or a negative code with the reason logged (standalone.py)."""
        from mooncake.store.client.standalone import dummy_config

        if self._cfg is not None:
            return self._setup_with(None)  # already set up: says so
        cfg, pool, code = dummy_config(mem_pool_size, local_buffer_size, server_address)
        return code if cfg is None else self._setup_with(cfg, pool)

    @typed(size=UINT)
    def alloc_from_mem_pool(self, size: int) -> int:
        """The address of `size` bytes of the memory pool of setup_dummy (registered: usable with every zero-copy
        call; held until close), or 0 when the pool is full, `size` is 0 or there is no pool (setup())."""
        if not self._ready("alloc_from_mem_pool"):
            return 0
        addr = self._mem_pool.alloc(size)
        if addr is None:
            _log.error("alloc_from_mem_pool: no %d bytes free in the memory pool (%d bytes; setup_dummy's "
                       "mem_pool_size)", size, self._mem_pool.size)
            return 0
        return addr

    # -- bytes: writes -----------------------------------------------------------------------------------------
    @typed(key=KEY, value=VALUE, config=CONFIG)
    def put(self, key, value, config: ReplicateConfig | None = None) -> int:
        return self._put_parts("put", key, (value,), config, upsert=False)

    @typed(key=KEY, parts=VALUE, config=CONFIG)
    def put_parts(self, key, *parts, config: ReplicateConfig | None = None) -> int:
        return self._put_parts("put_parts", key, parts, config, upsert=False)

    @typed(key=KEY, value=VALUE, config=CONFIG)
    def upsert(self, key, value, config: ReplicateConfig | None = None) -> int:
        return self._put_parts("upsert", key, (value,), config, upsert=True)

    @typed(key=KEY, parts=VALUE, config=CONFIG)
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
        return self.put_one(key, regions, False, config, upsert)

    @typed(keys=KEYS, values=seq(VALUE), config=CONFIG)
    def put_batch(self, keys, values, config: ReplicateConfig | None = None) -> int:
        return self._put_batch("put_batch", keys, values, config, upsert=False)

    @typed(keys=KEYS, values=seq(VALUE), config=CONFIG)
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
        codes = self.put_many(keys, [[r] for r in regions], False, config, upsert)
        return next((c for c in codes if c != OK), OK)

    # -- bytes: reads ------------------------------------------------------------------------------------------
    @typed(key=KEY)
    def get(self, key, /) -> bytes:
        return self._get_bytes("get", [key], bytes)[0] or b""

    @typed(key=KEY)
    def get_buffer(self, key, /) -> BufferHandle | None:
        return self._get_bytes("get_buffer", [key], BufferHandle)[0]

    @typed(keys=KEYS)
    def get_batch(self, keys, /) -> list[bytes]:
        return [v or b"" for v in self._get_bytes("get_batch", keys, bytes)]

    @typed(keys=KEYS)
    def batch_get_buffer(self, keys, /) -> list:
        return self._get_bytes("batch_get_buffer", keys, BufferHandle)

    def _get_bytes(self, op: str, keys: list, kind) -> list:
        """Per key a new `kind` (bytes / BufferHandle) holding the value, or None."""
        out: list = [None] * len(keys)
        if not self._ready(op) or not keys:
            return out
        good = _valid(op, keys)

        def dest(j: int, size: int):
            b, addr = new_bytes(size) if kind is bytes else _new_handle(size)
            out[good[j]] = b
            return [(addr, size)]
        if len(good) == 1:
            r = self.fast_read(keys[good[0]], dest, registered=False)
            if r is not None:
                if r < 0:
                    out[good[0]] = None
                return out
        results = self.get_many([keys[i] for i in good], dest, registered=False) if good else []
        for i, r in zip(good, results):
            if r < 0:
                out[i] = None
        return out

    @typed(key=KEY)
    def get_size(self, key, /) -> int:
        if not self._ready("get_size"):
            return NOT_READY
        why = key_error(key)
        if why:
            _log.error("get_size: %s", why)
            return _INVALID
        e = self._lookup([key])[0]
        return e if isinstance(e, int) else e.size

    @typed(key=KEY)
    def is_exist(self, key, /) -> int:
        return self._exist("is_exist", [key], _INVALID)[0]

    @typed(keys=KEYS)
    def batch_is_exist(self, keys) -> list[int]:
        return self._exist("batch_is_exist", keys, -1)

    def _exist(self, op: str, keys: list, fail: int) -> list[int]:
        """Per key 1 / 0, or `fail` (batch: -1, Mooncake's per-key error) for a bad key or a failed query;
        a single key gets the failure's own code."""
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        out = [fail] * len(keys)
        good = _valid(op, keys)
        if not good:
            return out
        reply = self._rpc("BatchExistKey", keys=[keys[i] for i in good])
        single = len(keys) == 1
        if isinstance(reply, int):
            for i in good:
                out[i] = reply if single else fail
            return out
        for i, r in zip(good, reply.results):
            if r.code == OK:
                out[i] = 1 if r.exists else 0
            elif r.code == ErrorCode.OBJECT_NOT_FOUND:
                out[i] = 0
            else:
                out[i] = r.code if single else fail
        return out

    # -- removal -----------------------------------------------------------------------------------------------
    @typed(key=KEY, force=FLAG)
    def remove(self, key, force: bool = False) -> int:
        return self._remove("remove", [key], force)[0]

    @typed(keys=KEYS, force=FLAG)
    def batch_remove(self, keys, force: bool = False) -> list[int]:
        return self._remove("batch_remove", keys, force)

    def _remove(self, op: str, keys: list, force: bool) -> list[int]:
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        out = [_INVALID] * len(keys)
        good = _valid(op, keys)
        if not good:
            return out
        names = [keys[i] for i in good]
        self._cache_drop(names)
        reply = self._rpc("BatchRemove", keys=names, force=force)
        codes = [reply] * len(good) if isinstance(reply, int) else list(reply.codes)
        for i, c in zip(good, codes):
            out[i] = c
        if OK in codes:
            self._disk_drops_soon()
        return out

    @typed(regex_pattern=STR, force=FLAG)
    def remove_by_regex(self, regex_pattern, force: bool = False) -> int:
        if not self._ready("remove_by_regex"):
            return NOT_READY
        self.cache_clear()
        reply = self._rpc("RemoveByRegex", pattern=regex_pattern, force=force)
        self._disk_drops_soon()
        return reply if isinstance(reply, int) else (reply.code or reply.count)

    @typed(force=FLAG)
    def remove_all(self, force: bool = False) -> int:
        if not self._ready("remove_all"):
            return NOT_READY
        self.cache_clear()
        reply = self._rpc("RemoveAll", force=force)
        self._disk_drops_soon()
        return reply if isinstance(reply, int) else (reply.code or reply.count)

    # -- zero copy ---------------------------------------------------------------------------------------------
    @typed(buffer_ptr=UINT, size=UINT)
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Registers [buffer_ptr, buffer_ptr+size) for zero-copy calls. Registering overlapping memory fails,
        except memory the owner of a shared engine (setup's `engine`) registered: it is used as it is."""
        if not self._ready("register_buffer"):
            return NOT_READY
        if buffer_ptr == 0 or size == 0:
            _log.error("register_buffer: buffer_ptr and size must be positive")
            return _INVALID
        if not self._ranges.add(buffer_ptr, size):
            _log.error("register_buffer: [%#x, +%d) overlaps memory already registered", buffer_ptr, size)
            return _INVALID
        rc = self._engine.register_memory(buffer_ptr, size)
        if rc == _OVERLAPPED and not self._own_engine:
            _log.info("register_buffer: [%#x, +%d) is registered with the shared Transfer Engine already: used as "
                      "it is", buffer_ptr, size)
            self._borrowed.add(buffer_ptr)
            self._devices.note(buffer_ptr, size)
            return OK
        if rc != 0:
            self._ranges.remove(buffer_ptr)
            return _INVALID
        self._devices.note(buffer_ptr, size)
        return OK

    @typed(buffer_ptr=UINT)
    def unregister_buffer(self, buffer_ptr: int) -> int:
        if not self._ready("unregister_buffer"):
            return NOT_READY
        if self._ranges.remove(buffer_ptr) is None:
            _log.error("unregister_buffer: %#x was not registered with register_buffer", buffer_ptr)
            return _INVALID
        self._devices.forget(buffer_ptr)
        if buffer_ptr in self._borrowed:  # the shared engine's owner registered it: theirs to undo
            self._borrowed.discard(buffer_ptr)
            return OK
        return OK if self._engine.unregister_memory(buffer_ptr) == 0 else _INVALID

    def _regions_ok(self, op: str, ptrs, sizes) -> bool:
        for p, n in zip(ptrs, sizes):
            if n and not self._ranges.contains(p, n):
                _log.error("%s: [%#x, +%d) is not inside a registered buffer (register_buffer first)", op, p, n)
                return False
        return True

    @typed(key=KEY, buffer_ptr=UINT, size=UINT, config=CONFIG)
    def put_from(self, key, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        return self._put_from("put_from", [key], [[buffer_ptr]], [[size]], config, False)[0]

    @typed(key=KEY, buffer_ptr=UINT, size=UINT, config=CONFIG)
    def upsert_from(self, key, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        return self._put_from("upsert_from", [key], [[buffer_ptr]], [[size]], config, True)[0]

    @typed(key=KEY, buffer_ptr=UINT, metadata_buffer_ptr=UINT, size=UINT, metadata_size=UINT, config=CONFIG)
    def put_from_with_metadata(self, key, buffer_ptr: int, metadata_buffer_ptr: int, size: int,
                               metadata_size: int, config: ReplicateConfig | None = None) -> int:
        """Stores [metadata][data] as one object."""
        return self._put_from("put_from_with_metadata", [key], [[metadata_buffer_ptr, buffer_ptr]],
                              [[metadata_size, size]], config, False)[0]

    @typed(keys=KEYS, buffer_ptrs=_PTRS, sizes=_PTRS, config=CONFIG)
    def batch_put_from(self, keys, buffer_ptrs, sizes, config: ReplicateConfig | None = None) -> list[int]:
        return self._batch_from("batch_put_from", keys, buffer_ptrs, sizes, config, False)

    @typed(keys=KEYS, buffer_ptrs=_PTRS, sizes=_PTRS, config=CONFIG)
    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config: ReplicateConfig | None = None) -> list[int]:
        return self._batch_from("batch_upsert_from", keys, buffer_ptrs, sizes, config, True)

    def _batch_from(self, op, keys, ptrs, sizes, config, upsert) -> list[int]:
        if not _same_len(op, keys, ptrs, sizes):
            return [_INVALID] * len(keys)
        return self._put_from(op, keys, [[p] for p in ptrs], [[s] for s in sizes], config, upsert)

    @typed(keys=KEYS, all_buffer_ptrs=_PTR_LISTS, all_sizes=_PTR_LISTS, config=CONFIG)
    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     config: ReplicateConfig | None = None) -> list[int]:
        """Object keys[i] = concatenation of the buffers all_buffer_ptrs[i][j] (all_sizes[i][j] bytes)."""
        op = "batch_put_from_multi_buffers"
        if not _same_len(op, keys, all_buffer_ptrs, all_sizes) or \
                not all(_same_len(op, p, s) for p, s in zip(all_buffer_ptrs, all_sizes)):
            return [_INVALID] * len(keys)
        return self._put_from(op, keys, all_buffer_ptrs, all_sizes, config, False)

    def _put_from(self, op, keys, ptr_lists, size_lists, config, upsert) -> list[int]:
        if not self._ready(op):
            return [NOT_READY] * len(keys)
        if not keys:
            return []
        if not all(self._regions_ok(op, p, s) for p, s in zip(ptr_lists, size_lists)):
            return [_INVALID] * len(keys)
        sources = [list(zip(p, s)) for p, s in zip(ptr_lists, size_lists)]
        return self.put_many(keys, sources, True, config, upsert)

    @typed(key=KEY, buffer_ptr=UINT, size=UINT)
    def get_into(self, key, buffer_ptr: int, size: int) -> int:
        r = self.fast_get_into(key, buffer_ptr, size)
        if r is not None:
            return r
        return self._get_into("get_into", [key], [[buffer_ptr]], [[size]])[0]

    @typed(keys=KEYS, buffer_ptrs=_PTRS, sizes=_PTRS)
    def batch_get_into(self, keys, buffer_ptrs, sizes) -> list[int]:
        if not _same_len("batch_get_into", keys, buffer_ptrs, sizes):
            return [_INVALID] * len(keys)
        return self._get_into("batch_get_into", keys, [[p] for p in buffer_ptrs], [[s] for s in sizes])

    @typed(keys=KEYS, all_buffer_ptrs=_PTR_LISTS, all_sizes=_PTR_LISTS, prefer_alloc_in_same_node=FLAG)
    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Scatters object keys[i] over its buffers in order; bytes read per key or negative."""
        op = "batch_get_into_multi_buffers"
        if not _same_len(op, keys, all_buffer_ptrs, all_sizes) or \
                not all(_same_len(op, p, s) for p, s in zip(all_buffer_ptrs, all_sizes)):
            return [_INVALID] * len(keys)
        return self._get_into(op, keys, all_buffer_ptrs, all_sizes)

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
                            lambda j, size: list(zip(ptr_lists[idx[j]], size_lists[idx[j]])),
                            registered=True) if idx else []
        for i, r in zip(idx, got):
            results[i] = r
        return results

    @typed(buffer_ptrs=_PTRS, all_keys=seq(KEYS), all_dst_offsets=_RANGES, all_src_offsets=_RANGES,
           all_sizes=_RANGES)
    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes) -> list:
        """results[i][j][k]: bytes copied from object all_keys[i][j] at all_src_offsets[i][j][k] into
        buffer_ptrs[i] + all_dst_offsets[i][j][k] (all_sizes[i][j][k] bytes), or a negative code for that
        fragment alone (shape mismatch, source range past the object, unregistered destination, missing
        key). The destination buffers must be registered. One row per buffer, one entry per key of
        all_keys[i], one code per fragment (per key, one code if its lists do not match)."""
        op = "get_into_ranges"
        if not self._ready(op):
            return _ranges_filled(buffer_ptrs, all_keys, all_sizes, NOT_READY)
        if not _same_len(op, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes):
            return _ranges_filled(buffer_ptrs, all_keys, all_sizes, _INVALID)
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
        entries = self._lookup(flat_keys) if flat_keys else []
        ops = []
        for (i, j), key, e in zip(where, flat_keys, entries):
            for k, (dst, src, n) in enumerate(zip(all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j])):
                if isinstance(e, int):
                    results[i][j][k] = e
                elif not e.replicas:  # ranged reads need a memory replica (as in Mooncake)
                    results[i][j][k] = int(ErrorCode.INVALID_REPLICA)
                elif src < 0 or n < 0 or src + n > e.size:
                    results[i][j][k] = int(ErrorCode.BUFFER_OVERFLOW)
                elif dst < 0 or not self._ranges.contains(buffer_ptrs[i] + dst, n):
                    results[i][j][k] = _INVALID
                else:
                    rep = min(e.replicas, key=lambda r: not self._is_mine(r))
                    ops.append((rep, buffer_ptrs[i] + dst, rep.address + src, n, (i, j, k)))
                    results[i][j][k] = n
        for i, j, k in self._transfer(ops, write=False):
            results[i][j][k] = int(ErrorCode.TRANSFER_FAIL)
        return results

    # -- introspection -----------------------------------------------------------------------------------------
    @typed(key=KEY)
    def get_replica_desc(self, key) -> list[ReplicaDescriptor]:
        return self.batch_get_replica_desc([key]).get(key, [])

    @typed(keys=KEYS)
    def batch_get_replica_desc(self, keys) -> dict:
        """{key: [ReplicaDescriptor]} ([] for a missing or bad key); a key given twice appears once."""
        if not self._ready("batch_get_replica_desc") or not keys:
            return {}
        out = {k: [] for k in keys}
        good = _valid("batch_get_replica_desc", keys)
        names = [keys[i] for i in good]
        for k, e in zip(names, self._lookup(names) if names else []):
            out[k] = [] if isinstance(e, int) else [ReplicaDescriptor(r) for r in (*e.replicas, *e.disk)]
        return out

    @typed(keys=KEYS, segment_name=STR)
    def batch_replica_clear(self, keys, segment_name: str = "") -> list[str]:
        """Clears keys this client wrote whose lease expired (only replicas on `segment_name` if given)."""
        if not self._ready("batch_replica_clear") or not keys:
            return []
        self._cache_drop(keys)
        reply = self._rpc("BatchReplicaClear", keys=keys, segment_name=segment_name)
        return [] if isinstance(reply, int) else list(reply.cleared_keys)


def _ranges_filled(buffer_ptrs, all_keys, all_sizes, code: int) -> list:
    """get_into_ranges' answer shape with every fragment `code` (one per key when its sizes are not given)."""
    out = []
    for i in range(len(buffer_ptrs)):
        keys = all_keys[i] if i < len(all_keys) else []
        sizes = all_sizes[i] if i < len(all_sizes) else []
        out.append([[code] * (len(sizes[j]) if j < len(sizes) else 1) for j in range(len(keys))])
    return out


def _new_handle(size: int):
    h = BufferHandle(new_bytes(size)[0])  # a copy of uninitialised memory: refilled below
    return h, h.ptr()
