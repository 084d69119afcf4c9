"""Transfer Engine: `from mooncake.engine import TransferEngine, TransferOpcode, TransferNotify`.

Same methods, argument order, return values and error codes as Mooncake's `mooncake.engine`; keyword
arguments work too. Buffers are integer addresses or, where natural, numpy arrays / torch CPU tensors /
buffer-protocol objects (used in place, never copied). The GIL is released while transfers run.
"""

from mooncake._native import (  # noqa: F401  (re-exported API)
    SUPPORT_CUDA,
    SUPPORT_EFA,
    SUPPORT_HIP,
    SUPPORT_INTRA_NVLINK,
    SUPPORT_MNNVL,
    SUPPORT_MUSA,
    InnerTransferEngine,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
)

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "InnerTransferEngine"]


# -- get_engine() handles ------------------------------------------------------------------------------------
def owner_of(handle):
    """The TransferEngine that `handle` (from its get_engine()) belongs to, or None for any other object. The
    handle keeps its engine alive while someone holds it."""
    return handle.owner if isinstance(handle, InnerTransferEngine) else None


# -- plugins -------------------------------------------------------------------------------------------------
# Transports and platforms are plugins: linked in, or .so files in mooncake/_plugins/ (and MC_PLUGIN_DIR) that
# are loaded on first use. A plugin that cannot run here is listed with its reason; it never fails an import.
from mooncake._native import plugin_states as _plugin_states  # noqa: E402


def _plugins():
    """Every transport and platform plugin, as a list of dicts: name, kind ("transport" or "platform"), origin
    ("builtin" or the .so path), protocols, state ("loaded", "unusable", "library_missing", "refused", "error")
    and reason (why it is not "loaded"; "" when it is). Callable on the class or an engine."""
    return _plugin_states()


def _get_supported_protocols():
    """The protocol strings ("tcp", "rdma", ...) of the transports usable on this host, in registration order.
    Callable on the class or an engine, before or without initialize()."""
    protocols = []
    for p in _plugin_states():
        if p["kind"] == "transport" and p["state"] == "loaded":
            protocols += [proto for proto in p["protocols"] if proto not in protocols]
    return protocols


_plugins.__name__ = _plugins.__qualname__ = "plugins"
_get_supported_protocols.__name__ = _get_supported_protocols.__qualname__ = "get_supported_protocols"
TransferEngine.plugins = staticmethod(_plugins)
TransferEngine.get_supported_protocols = staticmethod(_get_supported_protocols)
