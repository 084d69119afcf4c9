"""``from mooncake.mooncake_ep_buffer import Buffer`` (Mooncake's import path, used by SGLang's Mooncake EP
dispatcher): the same classes as ``mooncake.ep``; see ep/buffer.py for the API. Importing it needs torch."""

from mooncake.ep.buffer import Buffer, EventOverlap  # noqa: F401

__all__ = ["Buffer", "EventOverlap"]
