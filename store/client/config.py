"""Client-side configuration: ``ReplicateConfig`` and its enums, size strings, and ``setup`` arguments.

Contracts (reference §2.2, §2.12):
  * ``parse_size("16MB") == 16 << 20``: suffixes b/k/kb/m/mb/g/gb/t/tb (powers of 1024, case-insensitive,
    optional space, floats allowed); plain ints pass through. Empty, negative, "50%" or garbage -> ValueError.
  * ``ReplicateConfig`` fields and defaults are Mooncake's; ``soft_pin_ttl_ms`` negative or >= 2**64 raises
    TypeError on assignment; ``validate()`` returns INVALID_PARAMS (-600) for combinations the master would
    reject (a soft pin TTL without SoftPinAction.ENABLE, replica_num outside 1..64).
  * ``SetupConfig.from_args`` accepts the positional and the dict form of ``setup`` and raises ValueError
    with a clear message for a bad value.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re

from mooncake.store.master.errors import ErrorCode
from mooncake.store.master.objects import ReplicaStatus  # noqa: F401  (re-exported: one definition)
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


class ReplicateConfig:
    """Where and how a put places its replicas (Mooncake's ``ReplicateConfig``; every field read-write)."""

    __slots__ = ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action", "_soft_pin_ttl_ms",
                 "with_hard_pin", "preferred_segments", "preferred_nof_segments", "prefer_alloc_in_same_node",
                 "data_type", "group_ids")

    def __init__(self, replica_num: int = 1, soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE,
                 soft_pin_ttl_ms: int | None = None, with_hard_pin: bool = False,
                 preferred_segments: list[str] | None = None, preferred_segment: str = "",
                 prefer_alloc_in_same_node: bool = False, data_type: ObjectDataType = ObjectDataType.UNKNOWN,
                 group_ids: list[str] | None = None, nof_replica_num: int = 0, dfs_replica_num: int = 0) -> None:
        self.replica_num = replica_num
        self.nof_replica_num = nof_replica_num
        self.dfs_replica_num = dfs_replica_num
        self.soft_pin_action = SoftPinAction(soft_pin_action)
        self.soft_pin_ttl_ms = soft_pin_ttl_ms
        self.with_hard_pin = with_hard_pin
        self.preferred_segments = list(preferred_segments or [])
        if preferred_segment:
            self.preferred_segment = preferred_segment
        self.preferred_nof_segments: list[str] = []
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node
        self.data_type = ObjectDataType(data_type)
        self.group_ids = group_ids

    @property
    def soft_pin_ttl_ms(self) -> int | None:
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value: int | None) -> None:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64):
            raise TypeError(f"soft_pin_ttl_ms must be None or an int in [0, 2**64), got {value!r}")
        self._soft_pin_ttl_ms = value

    @property
    def preferred_segment(self) -> str:
        """Deprecated single-segment form of ``preferred_segments``."""
        return self.preferred_segments[0] if self.preferred_segments else ""

    @preferred_segment.setter
    def preferred_segment(self, name: str) -> None:
        self.preferred_segments = [name] if name else []

    def validate(self) -> int:
        """0, or INVALID_PARAMS (-600) for a config the master must not see."""
        if not isinstance(self.replica_num, int) or not 1 <= self.replica_num <= MAX_REPLICAS:
            return int(ErrorCode.INVALID_PARAMS)
        if self.soft_pin_ttl_ms is not None and self.soft_pin_action != SoftPinAction.ENABLE:
            return int(ErrorCode.INVALID_PARAMS)
        if self.nof_replica_num or self.dfs_replica_num:  # no NVMe-oF pool or shared-FS tier here
            return int(ErrorCode.INVALID_PARAMS)
        return 0

    def to_proto(self, local_segment: str = "") -> pb.ReplicateConfig:
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


PROTOCOLS = ("tcp", "rdma", "efa", "cxl", "nvlink", "hip", "barex", "ascend")
SUPPORTED_PROTOCOLS = ("tcp",)


@dataclasses.dataclass
class SetupConfig:
    local_hostname: str
    metadata_server: str
    global_segment_size: int = 16 << 20
    local_buffer_size: int = 16 << 20
    protocol: str = "tcp"
    rdma_devices: str = ""
    master_server_addr: str = "127.0.0.1:50051"
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    @classmethod
    def from_args(cls, args: tuple, kwargs: dict) -> "SetupConfig":
        """Positional form ``setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, ...)`` or dict form ``setup({...})``."""
        kwargs = dict(kwargs)
        kwargs.pop("engine", None)  # an external engine is not supported: the client owns its engine
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            fields = dict(args[0])
            fields.pop("ipc_socket_path", None)
            if "master_server_address" in fields and "master_server_addr" not in fields:
                fields["master_server_addr"] = fields.pop("master_server_address")
            if "device_name" in fields and "rdma_devices" not in fields:
                fields["rdma_devices"] = fields.pop("device_name")
            for required in ("local_hostname", "metadata_server"):
                if required not in fields:
                    raise ValueError(f"setup config lacks {required!r}")
        else:
            names = [f.name for f in dataclasses.fields(cls)]
            if len(args) > 7 and args[7] is not None:
                raise ValueError("setup: passing an external engine is not supported")
            args = args[:7] + args[8:]
            if len(args) > len(names):
                raise ValueError(f"setup takes at most {len(names) + 1} positional arguments")
            fields = dict(zip(names, args))
            overlap = set(fields) & set(kwargs)
            if overlap:
                raise ValueError(f"setup got multiple values for {sorted(overlap)}")
            fields.update(kwargs)
            missing = [n for n in names[:7] if n not in fields]
            if missing:
                raise ValueError(f"setup lacks required arguments {missing}")
        unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"setup: unknown option(s) {sorted(unknown)}")
        cfg = cls(**fields)
        cfg.global_segment_size = parse_size(cfg.global_segment_size)
        cfg.local_buffer_size = parse_size(cfg.local_buffer_size)
        cfg.protocol = str(cfg.protocol).lower()
        if not isinstance(cfg.local_hostname, str) or not cfg.local_hostname.strip():
            raise ValueError("local_hostname must be a non-empty string")
        if cfg.protocol not in SUPPORTED_PROTOCOLS:
            raise ValueError(f"protocol {cfg.protocol!r} is not supported by this build (supported: "
                             f"{', '.join(SUPPORTED_PROTOCOLS)})")
        if not isinstance(cfg.master_server_addr, str) or not cfg.master_server_addr:
            raise ValueError("master_server_addr must be 'host:port'")
        if cfg.enable_ssd_offload:
            cfg.ssd_offload_path = cfg.ssd_offload_path or os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "")
            if not cfg.ssd_offload_path:
                raise ValueError("enable_ssd_offload needs ssd_offload_path (or MOONCAKE_OFFLOAD_FILE_STORAGE_PATH)")
        return cfg
