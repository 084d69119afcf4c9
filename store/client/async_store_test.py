"""MooncakeDistributedStoreAsync against a real master: async_* forms run the store's methods concurrently."""

import asyncio

import pytest

from mooncake.store.client.async_store import MooncakeDistributedStoreAsync
from mooncake.store.master.testing import MasterProcess


@pytest.fixture(scope="module")
def master():
    m = MasterProcess()
    yield m
    m.stop()


def test_async_forms(master):
    async def main():
        s = MooncakeDistributedStoreAsync()
        assert await s.async_setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "4MB", "tcp", "", master.address) == 0
        try:
            codes = await asyncio.gather(*(s.async_put(f"k{i}", bytes([i]) * 1000) for i in range(16)))
            assert codes == [0] * 16
            values = await asyncio.gather(*(s.async_get(f"k{i}") for i in range(16)))
            assert values == [bytes([i]) * 1000 for i in range(16)]
            assert await s.async_batch_is_exist(["k0", "nope"]) == [1, 0]
            assert s.get_hostname() == s.store.get_hostname() != ""
            with pytest.raises(AttributeError):
                s.async_no_such_method
        finally:
            assert await s.async_close() == 0
    asyncio.run(main())
