"""mooncake.ep: fault-tolerant MoE expert-parallel dispatch/combine (DeepEP low-latency API + active_ranks)."""

from .buffer import Buffer, EventOverlap  # noqa: F401

__all__ = ["Buffer", "EventOverlap"]
