"""``MooncakeDistributedStoreAsync``: asyncio access to a MooncakeDistributedStore (Mooncake's async_store).

Every ``async_<name>(...)`` attribute is a coroutine function that runs ``store.<name>(...)`` in the event
loop's default executor (the store releases the GIL while data moves); every other attribute is the
store's own. Construct it around an existing store or let it create one: ``MooncakeDistributedStoreAsync()``
then ``await s.async_setup(...)``. Unknown ``async_*`` names raise AttributeError at access. Results and
exceptions are the store method's own: a wrong argument type raises its TypeError when awaited.
"""

from __future__ import annotations

import asyncio
import functools

from mooncake.store.client.store import MooncakeDistributedStore


class MooncakeDistributedStoreAsync:
    def __init__(self, store: MooncakeDistributedStore | None = None) -> None:
        self._store = store if store is not None else MooncakeDistributedStore()

    @property
    def store(self) -> MooncakeDistributedStore:
        return self._store

    def __getattr__(self, name: str):
        if name.startswith("async_"):
            method = getattr(self._store, name[len("async_"):])  # AttributeError for an unknown name

            async def run(*args, **kwargs):
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(None, functools.partial(method, *args, **kwargs))
            run.__name__ = name
            return run
        return getattr(self._store, name)
