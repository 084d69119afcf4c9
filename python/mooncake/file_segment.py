"""File segments: files (or block devices) addressed like a segment, read and written by the `file` transport
(Mooncake protocol `nvmeof`) with io_uring and O_DIRECT; no engine serves them.

``descriptor(name, files)`` builds the segment descriptor in Mooncake's nvmeof shape plus the fields this engine
needs (see transfer_engine/transport/file/README.md). Use it with

* ``engine.define_segment(name, descriptor(...))``: this process's own definition (nothing is published; the
  paths are trusted, so ``MC_FILE_ALLOWED_DIRS`` need not list them), or
* a metadata service (``mooncake/nvmeof/<segment>``), for other engines, which open only paths under their
  ``MC_FILE_ALLOWED_DIRS``.

Addresses: file *i* covers ``[BASE + (lengths of the files before it), + its length)``; ``BASE`` is also
``engine.get_first_buffer_address(name)``. The engine needs the file transport (``libmc_transport_file.so`` in
``mooncake/_plugins/`` or ``MC_PLUGIN_DIR``; ``TransferEngine.get_supported_protocols()`` lists ``nvmeof``).
"""

from __future__ import annotations

import json
import os

BASE = 1 << 40  # kFileSegmentBase


def descriptor(name: str, files, local_path_map: dict | None = None, direct: bool | None = None,
               read_only: bool = False) -> str:
    """The JSON descriptor of segment `name` over `files`: paths, or (path, length) pairs (length 0 or absent:
    the file's current size; the file must exist then), or (path, length, local_path_map) triples.
    `local_path_map` is Mooncake's map host name -> the path under which that host sees the file; the argument is
    the default for files without their own. `direct` (not Mooncake's): open the files with O_DIRECT (True) or
    through the page cache (False) whatever ``MC_FILE_DIRECT`` says; None: as it says. `read_only` (not
    Mooncake's): the files are opened read-only and writes to them are refused. TypeError for wrong types,
    ValueError for an empty list, an empty path, or a zero length."""
    if direct is not None and not isinstance(direct, bool):
        raise TypeError("direct must be a bool or None")
    if not isinstance(read_only, bool):
        raise TypeError("read_only must be a bool")
    if not isinstance(name, str) or not name:
        raise TypeError("name must be a non-empty str")
    if isinstance(files, (str, bytes)) or not hasattr(files, "__iter__"):
        raise TypeError("files must be a list of paths or (path, length[, local_path_map]) tuples")
    buffers, addr = [], BASE
    for f in files:
        entry = (f,) if isinstance(f, str) else tuple(f)
        if not 1 <= len(entry) <= 3:
            raise TypeError(f"file entry {f!r}: a path or (path, length[, local_path_map]) expected")
        path, length, mapping = (entry + (0, None))[:3] if len(entry) == 1 else (entry + (None,))[:3]
        if not isinstance(path, str) or not isinstance(length, int) or isinstance(length, bool):
            raise TypeError(f"file entry {f!r}: (str path, int length) expected")
        if not path:
            raise ValueError("empty file path")
        if length == 0:
            length = os.stat(path).st_size
        if length <= 0:
            raise ValueError(f"file {path!r} has no bytes to cover")
        mapping = mapping if mapping is not None else (local_path_map or {})
        if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in mapping.items()):
            raise TypeError("local_path_map must map str host names to str paths")
        buffers.append({"name": "file", "addr": addr, "length": length, "offset": 0, "file_path": path,
                        "local_path_map": mapping})
        if direct is not None:
            buffers[-1]["direct"] = direct
        if read_only:
            buffers[-1]["read_only"] = True
        addr += length
    if not buffers:
        raise ValueError("a file segment needs at least one file")
    return json.dumps({"name": name, "server_name": name, "protocol": "nvmeof", "buffers": buffers})
