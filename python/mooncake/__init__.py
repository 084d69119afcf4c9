"""Mooncake: KVCache-centric infrastructure for LLM serving.

Subpackages: ``mooncake.engine`` (Transfer Engine), ``mooncake.store``, ``mooncake.pg``, ``mooncake.ep``,
``mooncake.tools``. Importing this package does no work: no network, no device, no threads.
"""

import os as _os

__version__ = "0.1.0"


_COMPONENTS = ("store", "pg", "ep", "tools")


def _join_component_folders():
    """In a source checkout (or a Bazel runfiles tree) the components live in top-level folders
    (store/, pg/, ep/, tools/) next to python/; make them importable as mooncake.<component>.
    In an installed wheel they are already inside this package and nothing is added."""
    package_dir = _os.path.dirname(_os.path.abspath(__file__))  # abspath: keep runfiles symlinks
    python_dir = _os.path.dirname(package_dir)
    if _os.path.basename(python_dir) != "python":
        return
    root = _os.path.dirname(python_dir)
    if any(_os.path.isfile(_os.path.join(root, c, "__init__.py")) for c in _COMPONENTS):
        __path__.append(root)


_join_component_folders()
