"""Mooncake Store (importable as ``mooncake.store``): ``MooncakeDistributedStore``, ``ReplicateConfig`` and friends
(the client, store/client/) and the master (``mooncake.store.master``).

The client names are loaded on first access (PEP 562), so importing ``mooncake.store.master`` alone does not
pull in the client and importing this package starts nothing.
"""

_EXPORTS = {
    "MooncakeDistributedStore": "mooncake.store.client.store",
    "BufferHandle": "mooncake.store.client.store",
    "ReplicaDescriptor": "mooncake.store.client.store",
    "ReplicateConfig": "mooncake.store.client.config",
    "SoftPinAction": "mooncake.store.client.config",
    "ReplicaStatus": "mooncake.store.client.config",
    "ObjectDataType": "mooncake.store.client.config",
    "TaskType": "mooncake.store.client.tasks",
    "TaskStatus": "mooncake.store.client.tasks",
    "QueryTaskResponse": "mooncake.store.client.tasks",
    "MooncakeHostMemAllocator": "mooncake.store.client.host_memory",
    "bind_to_numa_node": "mooncake.store.client.host_memory",
    "get_alloc_func_addr": "mooncake.store.client.host_memory",
    "get_free_func_addr": "mooncake.store.client.host_memory",
    "_serialize_tensor": "mooncake.store.client.tensor",
    "_deserialize_tensor": "mooncake.store.client.tensor",
    "_tensor_metadata_size": "mooncake.store.client.tensor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mooncake.store' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
