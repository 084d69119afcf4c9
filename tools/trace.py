"""Mooncake request traces (FAST'25 JSONL format): loading with validation, merging, and summary statistics.

Format (one JSON object per line, blank lines ignored): `timestamp` (ms from trace start), `input_length`,
`output_length` (tokens) and `hash_ids` (prefix-chained ids of `block_size`-token blocks, ids local to the file).
A line must satisfy len(hash_ids) <= ceil(input_length / block_size); a longer list means the block size is wrong.
Files may be gzip- or xz-compressed (recognised by their first bytes, whatever their name).

Traces are located by path or by short name (`conversation` -> `<dir>/conversation_trace.jsonl[.gz|.xz]`), where
<dir> is $MOONCAKE_TRACES_DIR when set, then the `traces/` folder next to this file: the released traces ship
there (`conversation`, `synthetic`, gzip-compressed), in the source tree and in the installed package alike.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass
from typing import IO, Sequence

from .common import ToolError

try:
    import lzma
except ImportError:  # a Python built without liblzma reads every trace but xz-compressed ones
    lzma = None

DEFAULT_BLOCK_SIZE = 512
TRACES_DIR_ENV = "MOONCAKE_TRACES_DIR"
# abspath, not realpath: under Bazel the shipped traces are runfiles next to this file's runfiles link.
SHIPPED_TRACES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces")
SHIPPED_TRACES = ("conversation", "synthetic")
_NAME_SUFFIXES = ("_trace.jsonl", "_trace.jsonl.gz", "_trace.jsonl.xz")
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
# What reading a corrupt or truncated gzip/xz file raises.
_DECOMPRESSION_ERRORS = (gzip.BadGzipFile, zlib.error, EOFError) + ((lzma.LZMAError,) if lzma else ())


def trace_dirs() -> list[str]:
    """The folders a trace name is looked up in, in order: $MOONCAKE_TRACES_DIR (when set), the shipped traces."""
    env = os.environ.get(TRACES_DIR_ENV)
    return [env, SHIPPED_TRACES_DIR] if env else [SHIPPED_TRACES_DIR]


def resolve_trace_path(spec: str) -> str:
    """Maps a trace name (`conversation`, `synthetic`, ...) or a path to an existing file path.

    A name is a spec without a path separator or a .jsonl/.json/.gz/.xz ending; the first of
    `<dir>/<name>_trace.jsonl`, `.jsonl.gz`, `.jsonl.xz` that exists in the folders of `trace_dirs()` wins.

    Raises:
      ToolError: no such file.
    """
    if os.path.isfile(spec):
        return spec
    if os.sep not in spec and not spec.endswith((".jsonl", ".json", ".gz", ".xz")):
        dirs = trace_dirs()
        for d in dirs:
            for suffix in _NAME_SUFFIXES:
                candidate = os.path.join(d, spec + suffix)
                if os.path.isfile(candidate):
                    return candidate
        raise ToolError(f"trace {spec!r}: not a file, and no {spec}_trace.jsonl[.gz|.xz] in {' or '.join(dirs)} "
                        f"(shipped: {', '.join(SHIPPED_TRACES)}; set ${TRACES_DIR_ENV} to add a folder)")
    raise ToolError(f"trace {spec!r}: no such file")


def _open_text(path: str) -> IO[str]:
    """Opens a trace for reading text lines, decompressing gzip or xz files (told by their magic bytes).

    Raises:
      OSError: the file cannot be opened.
      ToolError: an xz file, and this Python has no lzma module.
    """
    with open(path, "rb") as f:
        magic = f.read(len(_XZ_MAGIC))
    if magic.startswith(_GZIP_MAGIC):
        return gzip.open(path, "rt", encoding="utf-8")
    if magic == _XZ_MAGIC:
        if lzma is None:
            raise ToolError(f"trace {path}: xz-compressed, and this Python has no lzma module")
        return lzma.open(path, "rt", encoding="utf-8")
    return open(path, "r", encoding="utf-8")


@dataclass(frozen=True)
class Trace:
    """A request trace held in columns (plain Python lists, fast to iterate).

    All columns have one entry per request, in replay order. `hash_ids[i]` is the block-id list of request i.
    """

    name: str
    block_size: int
    timestamps_ms: list[int]
    input_lengths: list[int]
    output_lengths: list[int]
    hash_ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.input_lengths)

    def block_tokens(self, request: int, blocks: int) -> int:
        """Tokens covered by the first `blocks` blocks of a request (the last block counts at its partial size)."""
        return min(blocks * self.block_size, self.input_lengths[request])

    def max_id(self) -> int:
        """Largest block id in the trace (-1 when it has no blocks)."""
        return max((max(ids) for ids in self.hash_ids if ids), default=-1)

    def subset(self, indices: Sequence[int]) -> "Trace":
        """The requests at `indices`, in that order."""
        return Trace(self.name, self.block_size, [self.timestamps_ms[i] for i in indices],
                     [self.input_lengths[i] for i in indices], [self.output_lengths[i] for i in indices],
                     [self.hash_ids[i] for i in indices])

    def head(self, n: int) -> "Trace":
        """The first n requests."""
        return self.subset(range(min(n, len(self))))


def _field(obj: dict, key: str, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ToolError(f"{where}: {key!r} must be a non-negative integer, got {value!r}")
    return value


def load_trace(spec: str, block_size: int = DEFAULT_BLOCK_SIZE, name: str | None = None) -> Trace:
    """Reads and validates a JSONL trace given by path or short name (see module docstring).

    Raises:
      ToolError: missing file, unreadable line, missing/ill-typed field, or hash_ids longer than the input allows.
    """
    if block_size <= 0:
        raise ToolError(f"block size must be > 0, got {block_size}")
    path = resolve_trace_path(spec)
    if name is None:
        base = os.path.basename(path)
        if base.endswith((".gz", ".xz")):
            base = base[:-3]
        for suffix in ("_trace.jsonl", ".jsonl", ".json"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
                break
        name = base
    ts, ins, outs, ids = [], [], [], []
    try:
        with _open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ToolError(f"{where}: not valid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise ToolError(f"{where}: expected a JSON object")
                n_in = _field(obj, "input_length", where)
                blocks = obj.get("hash_ids")
                if not isinstance(blocks, list) or not all(
                        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks):
                    raise ToolError(f"{where}: 'hash_ids' must be a list of non-negative integers")
                limit = -(-n_in // block_size)
                if len(blocks) > limit:
                    raise ToolError(f"{where}: {len(blocks)} hash_ids but input_length {n_in} spans only {limit} "
                                    f"blocks of {block_size} tokens (wrong --block-size?)")
                ts.append(_field(obj, "timestamp", where))
                outs.append(_field(obj, "output_length", where))
                ins.append(n_in)
                ids.append(blocks)
    except _DECOMPRESSION_ERRORS as e:
        raise ToolError(f"trace {path}: corrupt or truncated compressed file ({e})") from None
    except OSError as e:
        raise ToolError(f"trace {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ToolError(f"trace {path}: not a UTF-8 text file") from None
    if not ins:
        raise ToolError(f"trace {path}: no requests")
    return Trace(name, block_size, ts, ins, outs, ids)


def merge_traces(traces: Sequence[Trace], name: str | None = None) -> Trace:
    """One trace of all requests, ordered by timestamp (stable: ties keep trace order, then line order).

    Block ids of each trace are offset into disjoint ranges (every file numbers its ids from 0), so requests of
    different traces never share blocks.

    Raises:
      ToolError: the traces have different block sizes.
    """
    if len(traces) == 1:
        return traces[0]
    if len({t.block_size for t in traces}) != 1:
        raise ToolError("cannot merge traces with different block sizes")
    rows = []
    offset = 0
    for k, t in enumerate(traces):
        for i in range(len(t)):
            rows.append((t.timestamps_ms[i], k, i, offset))
        offset += t.max_id() + 1
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return Trace(
        name or "+".join(t.name for t in traces),
        traces[0].block_size,
        [r[0] for r in rows],
        [traces[r[1]].input_lengths[r[2]] for r in rows],
        [traces[r[1]].output_lengths[r[2]] for r in rows],
        [[b + r[3] for b in traces[r[1]].hash_ids[r[2]]] for r in rows],
    )


# ---- command-line helpers shared by the subcommands that read traces ------------------------------------------------

def add_trace_arguments(parser, merge_help: str | None = None) -> None:
    """Adds --trace (repeatable, required), --block-size and, when `merge_help` is given, --merge to an argparse
    parser."""
    parser.add_argument("--trace", action="append", required=True, metavar="NAME|PATH",
                        help="trace file (JSONL, may be gzip/xz-compressed), or a name: conversation, synthetic "
                             f"(shipped) or NAME_trace.jsonl in ${TRACES_DIR_ENV}; repeatable")
    parser.add_argument("--block-size", metavar="TOKENS", default=str(DEFAULT_BLOCK_SIZE),
                        help=f"tokens per hash_ids block of the trace (default {DEFAULT_BLOCK_SIZE})")
    if merge_help is not None:
        parser.add_argument("--merge", action="store_true", help=merge_help)


def check_merge_args(args) -> None:
    """Raises ToolError when --merge is given with fewer than two --trace (call before any long work)."""
    if getattr(args, "merge", False) and len(args.trace) < 2:
        raise ToolError("--merge needs at least two --trace")


def load_trace_args(args) -> list[Trace]:
    """Loads every --trace of parsed arguments (see add_trace_arguments), plus their merge (disjoint ids) last
    when --merge is given. Raises ToolError on bad input."""
    from .common import parse_count

    check_merge_args(args)
    block_size = parse_count(args.block_size, "--block-size")
    traces = [load_trace(spec, block_size) for spec in args.trace]
    if getattr(args, "merge", False):
        traces.append(merge_traces(traces))
    return traces
