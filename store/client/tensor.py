"""Tensor objects: Mooncake's 304-byte header (reference §2.3) followed by the raw tensor bytes, and the
tensor methods of MooncakeDistributedStore (a mixin over StoreCore's put_many/get_many).

Header (little endian): magic u32 0x4D4F4F4E, version u16 1, header_size u16 304, dtype i32, ndim i32,
layout_kind u32 (0 FULL, 1 SHARD), reserved u32, data_offset u64 304, data_bytes u64; then global_shape
i64[8], local_shape i64[8] (unused dims -1), axis_count u32, reserved u32, 4 axes {kind i32 (DP 0, TP 1,
EP 2, PP 3), axis_index i32, shard_rank i32, shard_count i32, split_dim i32, reserved i32, reserved i64}.
A FULL tensor has global_shape == local_shape and no axes; a TP shard (``*_with_tp``, stored under
"{key}_tp_{rank}") has one TP axis.

torch is imported on first use. Tensors must be on the CPU; non-contiguous ones are made contiguous (one
copy). Reads return a tensor owning fresh memory (``get_tensor``) or a view of the caller's registered
buffer (``get_tensor_into``). Failures return None (reads) or negative codes (writes), with a log line;
batch forms answer once per key, in order. Wrong Python types (a non-tensor value, a str key, a float rank)
raise TypeError before anything happens (validate.py); a tensor that cannot be stored (not on the CPU, an
unsupported dtype, more than 8 dims) is a bad value: INVALID_PARAMS.
"""

from __future__ import annotations

import ctypes
import logging
import struct

from mooncake.store.client.config import ReplicateConfig
from mooncake.store.client.memory import buffer_address
from mooncake.store.client.validate import CONFIG, INT, KEY, KEYS, TENSOR, UINT, seq, typed
from mooncake.store.common.errors import ErrorCode

_log = logging.getLogger("mooncake.store.client")

MAGIC = 0x4D4F4F4E
VERSION = 1
HEADER_SIZE = 304
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL, LAYOUT_SHARD = 0, 1
AXIS_TP = 1
_HEAD = struct.Struct("<IHHiiIIQQ")
_SHAPES = struct.Struct("<8q8qII")
_AXIS = struct.Struct("<6iq")
assert _HEAD.size + _SHAPES.size + MAX_AXES * _AXIS.size == HEADER_SIZE
_INVALID = int(ErrorCode.INVALID_PARAMS)
_DTYPE_NAMES = ["float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                "bool", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
_dtypes: dict | None = None
_TENSORS = seq(TENSOR)
_PTRS = seq(UINT)


def _torch():
    import torch
    return torch


def _dtype_tables():
    global _dtypes
    if _dtypes is None:
        torch = _torch()
        codes = {getattr(torch, n): i for i, n in enumerate(_DTYPE_NAMES) if hasattr(torch, n)}
        _dtypes = {"code": codes, "dtype": {i: d for d, i in codes.items()}}
    return _dtypes


def _tensor_metadata_size() -> int:
    return HEADER_SIZE


def encode_header(tensor, global_shape=None, shard=None) -> bytes:
    """The 304-byte header of `tensor`; `shard` = (rank, count, split_dim) for a TP shard of `global_shape`."""
    code = _dtype_tables()["code"].get(tensor.dtype)
    if code is None:
        raise TypeError(f"unsupported tensor dtype {tensor.dtype}")
    if tensor.dim() > MAX_DIMS:
        raise TypeError(f"tensors of more than {MAX_DIMS} dims are not supported")
    local = list(tensor.shape) + [-1] * (MAX_DIMS - tensor.dim())
    glob = list(global_shape or tensor.shape) + [-1] * (MAX_DIMS - tensor.dim())
    nbytes = tensor.numel() * tensor.element_size()
    head = _HEAD.pack(MAGIC, VERSION, HEADER_SIZE, code, tensor.dim(), LAYOUT_SHARD if shard else LAYOUT_FULL, 0,
                      HEADER_SIZE, nbytes)
    axes = [_AXIS.pack(AXIS_TP, 0, shard[0], shard[1], shard[2], 0, 0)] if shard else []
    axes += [_AXIS.pack(0, 0, 0, 0, 0, 0, 0)] * (MAX_AXES - len(axes))
    return head + _SHAPES.pack(*glob, *local, 1 if shard else 0, 0) + b"".join(axes)


def decode_header(raw) -> tuple:
    """(dtype, local_shape, data_bytes) from the first 304 bytes; ValueError if they are not a tensor header."""
    if len(raw) < HEADER_SIZE:
        raise ValueError("object shorter than a tensor header")
    magic, version, hsize, code, ndim, _, _, offset, nbytes = _HEAD.unpack_from(raw, 0)
    if magic != MAGIC or hsize != HEADER_SIZE or offset != HEADER_SIZE or not 0 <= ndim <= MAX_DIMS:
        raise ValueError("not a Mooncake tensor object (bad magic/header)")
    dtype = _dtype_tables()["dtype"].get(code)
    if dtype is None:
        raise ValueError(f"unknown tensor dtype code {code}")
    shapes = _SHAPES.unpack_from(raw, _HEAD.size)
    return dtype, list(shapes[MAX_DIMS:MAX_DIMS + ndim]), nbytes


def _serialize_tensor(tensor) -> bytes:
    t = _contiguous(tensor)
    return encode_header(t) + _raw(t)


def _deserialize_tensor(data):
    """Tensor from a serialized object (bytes-like); raises ValueError for data that is not one."""
    torch = _torch()
    dtype, shape, nbytes = decode_header(memoryview(data)[:HEADER_SIZE].tobytes())
    if len(data) < HEADER_SIZE + nbytes:
        raise ValueError("tensor object truncated")
    flat = torch.frombuffer(bytearray(memoryview(data)[HEADER_SIZE:HEADER_SIZE + nbytes]), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def _contiguous(tensor):
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise TypeError(f"tensor must be on the CPU, got {tensor.device}")
    return tensor.contiguous()


def _raw(t) -> bytes:
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _from_uint8(buf, size: int):
    """The tensor stored in uint8 tensor `buf` (header + data, `size` bytes valid): a view, no copy."""
    dtype, shape, nbytes = decode_header(bytes(buf[:HEADER_SIZE].numpy()))
    if size < HEADER_SIZE + nbytes:
        raise ValueError("tensor object truncated")
    return buf[HEADER_SIZE:HEADER_SIZE + nbytes].view(dtype).reshape(shape)


def _shards(tensor, tp_size: int, split_dim: int) -> list:
    if not 1 <= tp_size or not -tensor.dim() <= split_dim < max(1, tensor.dim()):
        raise ValueError(f"bad tp_size {tp_size} / split_dim {split_dim} for a {tensor.dim()}-dim tensor")
    return list(tensor.chunk(tp_size, dim=split_dim))


class TensorAPI:
    """Mixin for MooncakeDistributedStore (needs StoreCore's put_many / get_many / _ready)."""

    # -- writes ------------------------------------------------------------------------------------------------
    def _put_tensors(self, op: str, keys, tensors, config, upsert: bool, shard_info=None) -> list[int]:
        """shard_info[i] = (global_shape, (rank, count, split_dim)) for TP shards, else None."""
        if not self._ready(op):
            return [-1] * len(keys)
        if len(keys) != len(tensors):
            _log.error("%s: %d keys but %d tensors", op, len(keys), len(tensors))
            return [_INVALID] * len(keys)
        sources, keep, results = [], [], [0] * len(keys)
        for i, t in enumerate(tensors):
            try:
                t = _contiguous(t)
                info = shard_info[i] if shard_info else None
                head = encode_header(t, *(info or ()))
            except TypeError as e:
                _log.error("%s: %s", op, e)
                results[i] = _INVALID
                sources.append([])
                continue
            keep.append((t, head))
            sources.append([(buffer_address(head)[0], HEADER_SIZE),
                            (t.data_ptr(), t.numel() * t.element_size())])
        idx = [i for i in range(len(keys)) if results[i] == 0]
        codes = self.put_many([keys[i] for i in idx], [sources[i] for i in idx], False, config, upsert)
        for i, c in zip(idx, codes):
            results[i] = c
        del keep
        return results

    @typed(key=KEY, tensor=TENSOR)
    def put_tensor(self, key, tensor) -> int:
        return self._put_tensors("put_tensor", [key], [tensor], None, False)[0]

    @typed(key=KEY, tensor=TENSOR, config=CONFIG)
    def pub_tensor(self, key, tensor, config: ReplicateConfig | None = None) -> int:
        return self._put_tensors("pub_tensor", [key], [tensor], config, False)[0]

    @typed(key=KEY, tensor=TENSOR)
    def upsert_tensor(self, key, tensor) -> int:
        return self._put_tensors("upsert_tensor", [key], [tensor], None, True)[0]

    @typed(key=KEY, tensor=TENSOR, config=CONFIG)
    def upsert_pub_tensor(self, key, tensor, config: ReplicateConfig | None = None) -> int:
        return self._put_tensors("upsert_pub_tensor", [key], [tensor], config, True)[0]

    @typed(keys=KEYS, tensors_list=_TENSORS)
    def batch_put_tensor(self, keys, tensors_list) -> list[int]:
        return self._put_tensors("batch_put_tensor", list(keys), list(tensors_list), None, False)

    @typed(keys=KEYS, tensors_list=_TENSORS, config=CONFIG)
    def batch_pub_tensor(self, keys, tensors_list, config: ReplicateConfig | None = None) -> list[int]:
        return self._put_tensors("batch_pub_tensor", list(keys), list(tensors_list), config, False)

    @typed(keys=KEYS, tensors_list=_TENSORS)
    def batch_upsert_tensor(self, keys, tensors_list) -> list[int]:
        return self._put_tensors("batch_upsert_tensor", list(keys), list(tensors_list), None, True)

    @typed(keys=KEYS, tensors_list=_TENSORS, config=CONFIG)
    def batch_upsert_pub_tensor(self, keys, tensors_list, config: ReplicateConfig | None = None) -> list[int]:
        return self._put_tensors("batch_upsert_pub_tensor", list(keys), list(tensors_list), config, True)

    def _put_tp(self, op, keys, tensors, config, tp_size: int, split_dim: int) -> list[int]:
        """Every shard of every tensor, as "{key}_tp_{rank}"; per key the first failure or 0."""
        flat_keys, flat, info, owner = [], [], [], []
        for n, (key, t) in enumerate(zip(keys, tensors)):
            try:
                shards = _shards(_contiguous(t), tp_size, split_dim)
            except (TypeError, ValueError) as e:
                _log.error("%s: %s", op, e)
                return [_INVALID] * len(keys)
            for rank, s in enumerate(shards):
                flat_keys.append(f"{key}_tp_{rank}")
                flat.append(s)
                info.append((list(t.shape), (rank, tp_size, split_dim % max(1, t.dim()))))
                owner.append(n)
        codes = self._put_tensors(op, flat_keys, flat, config, False, info)
        out = [0] * len(keys)
        for n, c in zip(owner, codes):
            out[n] = out[n] or c
        return out

    @typed(key=KEY, tensor=TENSOR, tp_rank=INT, tp_size=INT, split_dim=INT)
    def put_tensor_with_tp(self, key, tensor, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        return self._put_tp("put_tensor_with_tp", [key], [tensor], None, tp_size, split_dim)[0]

    @typed(key=KEY, tensor=TENSOR, config=CONFIG, tp_rank=INT, tp_size=INT, split_dim=INT)
    def pub_tensor_with_tp(self, key, tensor, config: ReplicateConfig | None = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        return self._put_tp("pub_tensor_with_tp", [key], [tensor], config, tp_size, split_dim)[0]

    @typed(base_keys=KEYS, tensors_list=_TENSORS, tp_rank=INT, tp_size=INT, split_dim=INT)
    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:
        return self._put_tp("batch_put_tensor_with_tp", list(base_keys), list(tensors_list), None, tp_size,
                            split_dim)

    @typed(key=KEY, buffer_ptr=UINT, size=UINT)
    def put_tensor_from(self, key, buffer_ptr: int, size: int) -> int:
        """Stores an already serialized tensor (header + data, `size` bytes) from registered memory."""
        return self.put_from(key, buffer_ptr, size)

    @typed(keys=KEYS, buffer_ptrs=_PTRS, sizes=_PTRS)
    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes) -> list[int]:
        return self.batch_put_from(keys, buffer_ptrs, sizes)

    @typed(key=KEY, buffer_ptr=UINT, size=UINT)
    def upsert_tensor_from(self, key, buffer_ptr: int, size: int) -> int:
        return self.upsert_from(key, buffer_ptr, size)

    @typed(keys=KEYS, buffer_ptrs=_PTRS, sizes=_PTRS)
    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes) -> list[int]:
        return self.batch_upsert_from(keys, buffer_ptrs, sizes)

    # -- reads -------------------------------------------------------------------------------------------------
    def _get_tensors(self, op: str, keys) -> list:
        if not self._ready(op):
            return [None] * len(keys)
        torch = _torch()
        bufs: list = [None] * len(keys)

        def dest(i: int, size: int):
            bufs[i] = torch.empty(size, dtype=torch.uint8)
            return [(bufs[i].data_ptr(), size)]
        out = []
        for i, r in enumerate(self.get_many(list(keys), dest, registered=False)):
            try:
                out.append(_from_uint8(bufs[i], r) if r >= 0 else None)
            except ValueError as e:
                _log.error("%s %r: %s", op, keys[i], e)
                out.append(None)
        return out

    @typed(key=KEY)
    def get_tensor(self, key):
        return self._get_tensors("get_tensor", [key])[0]

    @typed(keys=KEYS)
    def batch_get_tensor(self, keys) -> list:
        return self._get_tensors("batch_get_tensor", list(keys))

    @typed(key=KEY, tp_rank=INT, tp_size=INT, split_dim=INT)
    def get_tensor_with_tp(self, key, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0):
        return self._get_tensors("get_tensor_with_tp", [f"{key}_tp_{tp_rank}"])[0]

    @typed(base_keys=KEYS, tp_rank=INT, tp_size=INT)
    def batch_get_tensor_with_tp(self, base_keys, tp_rank: int = 0, tp_size: int = 1) -> list:
        return self._get_tensors("batch_get_tensor_with_tp", [f"{k}_tp_{tp_rank}" for k in base_keys])

    @typed(key=KEY, buffer_ptr=UINT, size=UINT)
    def get_tensor_into(self, key, buffer_ptr: int, size: int):
        """Reads the object into registered memory and returns a tensor viewing it (None on failure)."""
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    @typed(keys=KEYS, buffer_ptrs=_PTRS, sizes=_PTRS)
    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes) -> list:
        torch = _torch()
        out = []
        for i, n in enumerate(self.batch_get_into(keys, buffer_ptrs, sizes)):  # one result per key
            if n < 0:  # (n >= 0: the lists matched, buffer_ptrs[i] exists)
                out.append(None)
                continue
            view = torch.frombuffer((ctypes.c_ubyte * n).from_address(buffer_ptrs[i]), dtype=torch.uint8)
            try:
                out.append(_from_uint8(view, n))
            except ValueError as e:
                _log.error("get_tensor_into %r: %s", keys[i], e)
                out.append(None)
        return out

    @typed(key=KEY, buffer_ptr=UINT, size=UINT, tp_rank=INT, tp_size=INT, split_dim=INT)
    def get_tensor_with_tp_into(self, key, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0):
        return self.get_tensor_into(f"{key}_tp_{tp_rank}", buffer_ptr, size)

    @typed(base_keys=KEYS, buffer_ptrs=_PTRS, sizes=_PTRS, tp_rank=INT, tp_size=INT)
    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank: int = 0,
                                      tp_size: int = 1) -> list:
        return self.batch_get_tensor_into([f"{k}_tp_{tp_rank}" for k in base_keys], buffer_ptrs, sizes)
