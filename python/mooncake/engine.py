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
