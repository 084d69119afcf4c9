"""Mooncake PG: a torch.distributed backend that survives failed ranks (reference §4).

`import mooncake.pg` registers the backends "mooncake-cpu" (CPU tensors) and "mooncake" (CUDA tensors,
staged through host memory; refused at init when CUDA is unavailable). Use

    dist.init_process_group("mooncake-cpu", rank=r, world_size=n, pg_options=MooncakeBackendOptions(n))

Data moves through the Transfer Engine (transport.py), membership changes without a coordinator
(membership.py). The functions below take the backend: the group object itself (`dist.group.WORLD`,
a `new_group` result) or a work object where noted.
"""

import importlib as _importlib
import sys as _sys

if __name__ != "mooncake.pg":
    # Imported under another name (a test runner put the repository root on sys.path): become the one
    # mooncake.pg module, so there is a single set of classes and a single backend registration.
    _sys.modules[__name__] = _importlib.import_module("mooncake.pg")
else:
    from .api import *  # noqa: F401,F403
    from .api import __all__  # noqa: F401
