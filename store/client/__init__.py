"""The store client: ``config`` (ReplicateConfig, setup options, sizes), ``memory`` (staging pool, registered
ranges), ``core`` (lifecycle, master RPCs, descriptor cache, data path), ``store`` (MooncakeDistributedStore),
``tensor`` (tensor header and tensor API), ``sessions`` (layer-wise get and put sessions), ``async_store``
(asyncio wrapper), ``service`` (mooncake_client), ``standalone`` (setup_dummy and the service's --port),
``host_memory`` (MooncakeHostMemAllocator, its C entry points, bind_to_numa_node)."""
