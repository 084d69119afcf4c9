"""Client-side configuration: ``ReplicateConfig`` and its enums, size strings, and ``setup`` arguments.

Contracts (reference §2.2, §2.12):
  * ``parse_size("16MB") == 16 << 20``: suffixes b/k/kb/m/mb/g/gb/t/tb (powers of 1024, case-insensitive,
    optional space, floats allowed); plain ints pass through. Empty, negative, "50%" or garbage -> ValueError.
  * ``ReplicateConfig`` fields and defaults are Mooncake's. Every assignment (constructor included) checks
    the type and raises TypeError for a wrong one: counts (replica_num, nof_/dfs_replica_num) and
    soft_pin_ttl_ms (or None) are ints in [0, 2**64) (Mooncake's size_t / uint64), pins and
    prefer_alloc_in_same_node bools (or 0 / 1), soft_pin_action / data_type members of their enum (or its
    value), preferred_segment a str, preferred_segments / preferred_nof_segments lists of str, group_ids None
    or a list of str. ``validate()`` returns INVALID_PARAMS (-600) for well-typed values the master would
    reject (a soft pin TTL without SoftPinAction.ENABLE, replica_num outside 1..64).
  * ``SetupConfig.from_args`` accepts the positional and the dict form of ``setup``. It raises TypeError for
    a wrong type or call shape (``setup(12345)``, a missing positional argument, an unknown keyword) and
    ValueError, with a clear message, for a bad value (empty hostname, unknown protocol, "50%", a dict
    lacking local_hostname); ``SetupConfig.check_types`` raises only the TypeErrors. The dict form also takes
    the clients' key names ``master_server_address`` (= ``master_server_addr``) and ``device_name``
    (= ``rdma_devices``); a dict may hold both names of one option only with the same value.
  * ``protocol`` is one of Mooncake's names (PROTOCOLS, else ValueError); it is handed to the Transfer Engine,
    which serves it with the transport of that name where this build and host have one; where it cannot,
    setup fails with the engine's reason (logged).
  * ``engine`` (8th positional, or keyword): None (the store creates and owns its Transfer Engine), or an
    initialized ``mooncake.engine.TransferEngine`` or its ``get_engine()`` handle, to share: the store then
    uses that engine (its segment name, metadata, transports, registrations) and never closes it; its own
    buffers are freed and registrations undone at ``close``. A handle whose engine is unknown, or an engine
    that is not initialized, is a ValueError; any other type a TypeError. from_args resolves a handle to its
    engine (``engine`` is then the TransferEngine).
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import os
import re

from mooncake.store.client.validate import (FLAG, INT, SIZE, STR, UINT, Wrong, check, either, enum_of, optional,
                                            seq)
from mooncake.store.common.errors import ErrorCode
from mooncake.store.common.protocol import ReplicaStatus  # noqa: F401  (re-exported: one definition)
from mooncake.store.proto import mooncake_master_pb2 as pb

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30,
          "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
MAX_REPLICAS = 64


def parse_size(value) -> int:
    """Bytes from an int or a human-readable string ("16MB", "1.5 GiB" is rejected: use "1.5GB")."""
    if isinstance(value, bool):
        raise ValueError(f"size must be an int or a string like '16MB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"size must be an int or a string like '16MB', got {value!r}")
    m = _SIZE_RE.match(value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"bad size {value!r}: use a number with an optional unit b/kb/mb/gb/tb (powers of 1024)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(enum.IntEnum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


_PROTO_CACHE: dict[tuple, pb.ReplicateConfig] = {}  # ReplicateConfig.to_proto, by content


class ReplicateConfig:
    """Where and how a put places its replicas (Mooncake's ``ReplicateConfig``; every field read-write and
    type-checked on assignment, see the module docstring)."""

    __slots__ = ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action", "soft_pin_ttl_ms",
                 "with_hard_pin", "preferred_segments", "preferred_nof_segments", "prefer_alloc_in_same_node",
                 "data_type", "group_ids")

    def __init__(self, replica_num: int = 1, soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE,
                 soft_pin_ttl_ms: int | None = None, with_hard_pin: bool = False,
                 preferred_segments: list[str] | None = None, preferred_segment: str = "",
                 prefer_alloc_in_same_node: bool = False, data_type: ObjectDataType = ObjectDataType.UNKNOWN,
                 group_ids: list[str] | None = None, nof_replica_num: int = 0, dfs_replica_num: int = 0) -> None:
        args = (replica_num, soft_pin_action, soft_pin_ttl_ms, with_hard_pin, preferred_segments, preferred_segment,
                prefer_alloc_in_same_node, data_type, group_ids, nof_replica_num, dfs_replica_num)
        # All defaults (the config of every put without one): nothing to check.
        put = object.__setattr__ if all(map(operator.is_, args, _INIT_DEFAULTS)) else ReplicateConfig.__setattr__
        put(self, "replica_num", replica_num)
        put(self, "nof_replica_num", nof_replica_num)
        put(self, "dfs_replica_num", dfs_replica_num)
        put(self, "soft_pin_action", soft_pin_action)
        put(self, "soft_pin_ttl_ms", soft_pin_ttl_ms)
        put(self, "with_hard_pin", with_hard_pin)
        put(self, "preferred_segments", [] if preferred_segments is None else preferred_segments)
        if preferred_segment != "":
            self.preferred_segment = preferred_segment
        put(self, "preferred_nof_segments", [])
        put(self, "prefer_alloc_in_same_node", prefer_alloc_in_same_node)
        put(self, "data_type", data_type)
        put(self, "group_ids", group_ids)

    def __setattr__(self, name: str, value) -> None:
        kind = _REPLICATE_FIELDS.get(name)
        if kind is not None:
            value = check(kind, value, f"ReplicateConfig.{name}")
        object.__setattr__(self, name, value)

    @property
    def preferred_segment(self) -> str:
        """Deprecated single-segment form of ``preferred_segments``."""
        return self.preferred_segments[0] if self.preferred_segments else ""

    @preferred_segment.setter
    def preferred_segment(self, name: str) -> None:
        self.preferred_segments = [name] if name else []

    def validate(self) -> int:
        """0, or INVALID_PARAMS (-600) for a config the master must not see."""
        if not 1 <= self.replica_num <= MAX_REPLICAS:
            return int(ErrorCode.INVALID_PARAMS)
        if self.soft_pin_ttl_ms is not None and self.soft_pin_action != SoftPinAction.ENABLE:
            return int(ErrorCode.INVALID_PARAMS)
        if self.nof_replica_num or self.dfs_replica_num:  # no NVMe-oF pool or shared-FS tier here
            return int(ErrorCode.INVALID_PARAMS)
        return 0

    def to_proto(self, local_segment: str = "") -> pb.ReplicateConfig:
        """The request field for this config. The message may be shared with other callers: do not modify it
        (request constructors copy it). Cached by content: the list fields may change in place."""
        key = (self.replica_num, self.soft_pin_action, self.soft_pin_ttl_ms, self.with_hard_pin,
               tuple(self.preferred_segments), self.prefer_alloc_in_same_node, local_segment)
        proto = _PROTO_CACHE.get(key)
        if proto is None:
            if len(_PROTO_CACHE) >= 256:
                _PROTO_CACHE.clear()
            proto = _PROTO_CACHE[key] = self._build_proto(local_segment)
        return proto

    def _build_proto(self, local_segment: str) -> pb.ReplicateConfig:
        preferred = list(self.preferred_segments)
        if self.prefer_alloc_in_same_node and local_segment and local_segment not in preferred:
            preferred.insert(0, local_segment)
        return pb.ReplicateConfig(replica_num=self.replica_num, preferred_segments=preferred,
                                  with_soft_pin=self.soft_pin_action == SoftPinAction.ENABLE,
                                  with_hard_pin=bool(self.with_hard_pin),
                                  soft_pin_ttl_ms=self.soft_pin_ttl_ms or 0)

    def __repr__(self) -> str:
        return (f"ReplicateConfig(replica_num={self.replica_num}, soft_pin_action={self.soft_pin_action.name}, "
                f"soft_pin_ttl_ms={self.soft_pin_ttl_ms}, with_hard_pin={self.with_hard_pin}, "
                f"preferred_segments={self.preferred_segments}, "
                f"prefer_alloc_in_same_node={self.prefer_alloc_in_same_node}, data_type={self.data_type.name}, "
                f"group_ids={self.group_ids})")

    __str__ = __repr__


_STRS = seq(STR)


def _SEGMENTS(v) -> list:
    """A list of str, copied (the config keeps its own)."""
    v2 = _STRS(v)
    return list(v2) if v2 is v else v2


_INIT_DEFAULTS = (1, SoftPinAction.PRESERVE, None, False, None, "", False, ObjectDataType.UNKNOWN, None, 0, 0)
_REPLICATE_FIELDS = {
    "replica_num": UINT, "nof_replica_num": UINT, "dfs_replica_num": UINT,
    "soft_pin_action": enum_of(SoftPinAction), "soft_pin_ttl_ms": optional(UINT), "with_hard_pin": FLAG,
    "preferred_segments": _SEGMENTS, "preferred_segment": STR, "preferred_nof_segments": _SEGMENTS,
    "prefer_alloc_in_same_node": FLAG, "data_type": enum_of(ObjectDataType), "group_ids": optional(_SEGMENTS),
}

PROTOCOLS = ("tcp", "rdma", "efa", "cxi", "cxl", "nvlink", "nvlink_intra", "hip", "musa", "maca", "barex",
             "ascend", "ubshmem", "ub", "nccl")


@dataclasses.dataclass
class SetupConfig:
    local_hostname: str
    metadata_server: str
    global_segment_size: int = 16 << 20
    local_buffer_size: int = 16 << 20
    protocol: str = "tcp"
    rdma_devices: str = ""
    master_server_addr: str = "127.0.0.1:50051"
    engine: object = None
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    @classmethod
    def from_args(cls, args: tuple, kwargs: dict) -> "SetupConfig":
        """Positional form ``setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, ...)`` or dict form ``setup({...})``."""
        fields = cls._typed_fields(args, kwargs)
        cfg = cls(**fields)
        cfg.global_segment_size = parse_size(cfg.global_segment_size)
        cfg.local_buffer_size = parse_size(cfg.local_buffer_size)
        cfg.protocol = cfg.protocol.lower()
        cfg.enable_ssd_offload = _parse_flag("enable_ssd_offload", cfg.enable_ssd_offload)
        cfg.enable_client_http_server = _parse_flag("enable_client_http_server", cfg.enable_client_http_server)
        cfg.client_http_port = _parse_port(cfg.client_http_port)
        if not cfg.local_hostname.strip():
            raise ValueError("local_hostname must be a non-empty string")
        if cfg.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {cfg.protocol!r} (Mooncake's names: {', '.join(PROTOCOLS)})")
        cfg.engine = _shared_engine(cfg.engine)
        if not cfg.master_server_addr:
            raise ValueError("master_server_addr must be 'host:port'")
        if cfg.enable_ssd_offload:
            cfg.ssd_offload_path = cfg.ssd_offload_path or os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "")
            if not cfg.ssd_offload_path:
                raise ValueError("enable_ssd_offload needs ssd_offload_path (or MOONCAKE_OFFLOAD_FILE_STORAGE_PATH)")
        return cfg

    @classmethod
    def check_types(cls, args: tuple, kwargs: dict) -> None:
        """Raises the TypeErrors from_args would raise (wrong types, call shape); bad values pass."""
        try:
            cls._typed_fields(args, kwargs)
        except ValueError:
            pass

    @classmethod
    def _typed_fields(cls, args: tuple, kwargs: dict) -> dict:
        """The setup options by field name, each of the right type. TypeError for a wrong type or call shape;
        then ValueError for a dict lacking a required key or holding unknown ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        problem = None  # a ValueError raised once every type is checked
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            fields = dict(args[0])
            bad = [k for k in fields if not isinstance(k, str)]
            if bad:
                raise TypeError(f"setup(): config keys must be str, got {type(bad[0]).__name__}")
            fields.pop("ipc_socket_path", None)
            problem = _merge_aliases(fields)
            unknown = set(fields) - set(names)
            missing = [n for n in ("local_hostname", "metadata_server") if n not in fields]
            if problem is None and unknown:
                problem = f"setup: unknown option(s) {sorted(unknown)}"
            elif problem is None and missing:
                problem = f"setup config lacks {missing[0]!r}"  # a ValueError in the dict form
        else:
            if len(args) > len(names):
                raise TypeError(f"setup() takes at most {len(names)} positional arguments ({len(args)} given)")
            fields = dict(zip(names, args))
            overlap = set(fields) & set(kwargs)
            if overlap:
                raise TypeError(f"setup() got multiple values for {sorted(overlap)}")
            unknown = set(kwargs) - set(names)
            if unknown:
                raise TypeError(f"setup() got unexpected keyword argument(s) {sorted(unknown)}")
            fields.update(kwargs)
            missing = [n for n in names[:7] if n not in fields]
        for name, value in fields.items():
            if name in _SETUP_FIELDS:
                fields[name] = check(_SETUP_FIELDS[name], value, f"setup(): {name}")
        if missing and not problem:
            raise TypeError(f"setup() lacks required argument(s) {missing}")
        if problem:
            raise ValueError(problem)
        return fields


# Dict-form keys the clients' configs use (vLLM, SGLang, LMCache JSON) -> the SetupConfig field they name.
_SETUP_ALIASES = {"master_server_address": "master_server_addr", "device_name": "rdma_devices"}


def _merge_aliases(fields: dict) -> str | None:
    """Renames alias keys of a dict-form config in place. An alias and its field may both be present when they
    hold the same value; returns the problem (naming both keys) when they disagree, else None."""
    problem = None
    for alias, name in _SETUP_ALIASES.items():
        if alias not in fields:
            continue
        value = fields.pop(alias)
        if name not in fields:
            fields[name] = value
        elif fields[name] != value and problem is None:
            problem = (f"setup: {alias!r} ({value!r}) and {name!r} ({fields[name]!r}) name the same option with "
                       "different values; give one of them, or the same value in both")
    return problem


def ENGINE(v):
    """setup()'s `engine`: None, a TransferEngine or its get_engine() handle (returned as given)."""
    if v is None:
        return v
    from mooncake.engine import InnerTransferEngine, TransferEngine  # loaded only when an engine is given
    if isinstance(v, (TransferEngine, InnerTransferEngine)):
        return v
    raise Wrong("None, a mooncake.engine.TransferEngine or its get_engine() handle", v)


def _shared_engine(engine):
    """The TransferEngine to share for setup()'s `engine` (None: none); ValueError when it cannot be used."""
    if engine is None:
        return None
    from mooncake.engine import TransferEngine, owner_of
    if not isinstance(engine, TransferEngine):
        owner = owner_of(engine)
        if owner is None:
            raise ValueError("engine: this get_engine() handle belongs to no live TransferEngine")
        engine = owner
    if not engine.get_local_segment_name():
        raise ValueError("engine: the TransferEngine is not initialized (call initialize() first) or was closed")
    return engine


def _parse_flag(name: str, value) -> bool:
    """A bool option: a bool, 0 / 1, or (dict form) "true"/"false"/"1"/"0"/"yes"/"no"/"on"/"off"/""."""
    if not isinstance(value, str):
        return bool(value)
    word = value.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"{name} must be a bool (true/false), got {value!r}")


def _parse_port(value) -> int:
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"client_http_port must be a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"client_http_port must be in [0, 65535], got {port}")
    return port


_SETUP_FIELDS = {
    "local_hostname": STR, "metadata_server": STR, "global_segment_size": SIZE, "local_buffer_size": SIZE,
    "protocol": STR, "rdma_devices": STR, "master_server_addr": STR, "engine": ENGINE,
    "enable_ssd_offload": either(FLAG, STR, expected="a bool"), "ssd_offload_path": STR, "tenant_id": STR,
    "enable_client_http_server": either(FLAG, STR, expected="a bool"),
    "client_http_port": either(INT, STR, expected="a port number"),
}
