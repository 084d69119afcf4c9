"""Mooncake Store (importable as ``mooncake.store``): the master lives in ``mooncake.store.master``."""
