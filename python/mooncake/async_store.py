"""``from mooncake.async_store import MooncakeDistributedStoreAsync`` (Mooncake's import path); the class lives in
``mooncake.store.client.async_store``."""

from mooncake.store.client.async_store import MooncakeDistributedStoreAsync  # noqa: F401

__all__ = ["MooncakeDistributedStoreAsync"]
