"""Test helpers for the planning tools (test-only): tiny traces written to temporary files, and the released
traces read from the copy shipped with the package."""

from __future__ import annotations

import json
import os
from typing import Iterable

from .trace import SHIPPED_TRACES_DIR, Trace, load_trace


def write_trace(path, rows: Iterable[dict]) -> str:
    """Writes rows as a JSONL trace; rows may omit timestamp (defaults to 0) and output_length (defaults to 1)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"timestamp": r.get("timestamp", 0), "input_length": r["input_length"],
                                "output_length": r.get("output_length", 1), "hash_ids": r["hash_ids"]}) + "\n")
    return str(path)


def make_trace(requests: list, block_size: int = 512, name: str = "t", timestamps=None, outputs=None,
               input_lengths=None) -> Trace:
    """An in-memory trace from block-id lists; inputs default to full blocks."""
    n = len(requests)
    return Trace(name, block_size, list(timestamps or [0] * n),
                 list(input_lengths or [len(ids) * block_size for ids in requests]), list(outputs or [1] * n),
                 [list(ids) for ids in requests])


def released_trace(name: str) -> Trace:
    """A released trace (conversation, synthetic), always the shipped copy ($MOONCAKE_TRACES_DIR is ignored)."""
    return load_trace(os.path.join(SHIPPED_TRACES_DIR, f"{name}_trace.jsonl.gz"))
