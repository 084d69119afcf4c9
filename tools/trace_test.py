import gzip
import hashlib
import lzma
import os
import re

import pytest

from mooncake.tools.common import ToolError
from mooncake.tools.testutil import make_trace, write_trace
from mooncake.tools.trace import (SHIPPED_TRACES, SHIPPED_TRACES_DIR, TRACES_DIR_ENV, load_trace, merge_traces,
                                  resolve_trace_path)

ROWS = [{"timestamp": 5, "input_length": 700, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 9, "input_length": 512, "hash_ids": [0]}]


def test_load_reads_columns_and_skips_blank_lines(tmp_path):
    path = write_trace(tmp_path / "a_trace.jsonl", [
        {"timestamp": 5, "input_length": 700, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 9, "input_length": 512, "hash_ids": [0]},
    ])
    with open(path, "a") as f:
        f.write("\n   \n")
    t = load_trace(path)
    assert t.name == "a"
    assert len(t) == 2
    assert t.timestamps_ms == [5, 9]
    assert t.input_lengths == [700, 512]
    assert t.output_lengths == [3, 1]
    assert t.hash_ids == [[0, 1], [0]]
    assert t.block_tokens(0, 2) == 700  # partial last block
    assert t.block_tokens(0, 1) == 512


@pytest.mark.parametrize("line, message", [
    ("{not json", r"x\.jsonl:2: not valid JSON"),
    ("[1, 2]", r"x\.jsonl:2: expected a JSON object"),
    ('{"timestamp": 0, "output_length": 1, "hash_ids": []}', "'input_length' must be a non-negative integer"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": "ab"}', "'hash_ids' must be a list"),
    ('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}', "'timestamp' must be"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1, 2]}',
     "3 hash_ids but input_length 600 spans only 2 blocks"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "x.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]}\n' + line + "\n")
    with pytest.raises(ToolError, match=message):
        load_trace(str(path))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ToolError, match="no such file"):
        load_trace(str(tmp_path / "absent.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ToolError, match="no requests"):
        load_trace(str(tmp_path / "empty.jsonl"))
    with pytest.raises(ToolError, match="block size"):
        load_trace(str(tmp_path / "empty.jsonl"), block_size=0)


def test_names_resolve_in_the_traces_folder(tmp_path, monkeypatch):
    write_trace(tmp_path / "mine_trace.jsonl", [{"input_length": 1, "hash_ids": [0]}])
    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path))
    assert resolve_trace_path("mine") == str(tmp_path / "mine_trace.jsonl")
    with pytest.raises(ToolError, match=r"no other_trace\.jsonl\[\.gz\|\.xz\] in .* or .*shipped: conversation, "
                                         r"synthetic; set \$MOONCAKE_TRACES_DIR"):
        resolve_trace_path("other")


def test_names_fall_back_to_the_shipped_traces(tmp_path, monkeypatch):
    shipped = os.path.join(SHIPPED_TRACES_DIR, "synthetic_trace.jsonl.gz")
    monkeypatch.delenv(TRACES_DIR_ENV, raising=False)
    assert resolve_trace_path("synthetic") == shipped
    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path))  # a folder without it: still the shipped copy
    assert resolve_trace_path("synthetic") == shipped
    # $MOONCAKE_TRACES_DIR comes first, and a compressed copy there counts.
    own = tmp_path / "synthetic_trace.jsonl.gz"
    own.write_bytes(gzip.compress(b"{}"))
    assert resolve_trace_path("synthetic") == str(own)
    t = load_trace("conversation")
    assert (t.name, len(t)) == ("conversation", 12031)


def test_shipped_traces_are_the_released_files():
    # The SHA-256 of each decompressed file is recorded in traces/README.md (the released files' digests).
    with open(os.path.join(SHIPPED_TRACES_DIR, "README.md"), encoding="utf-8") as f:
        recorded = {name: digest for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", f.read(), re.M)}
    assert sorted(recorded) == sorted(f"{n}_trace.jsonl" for n in SHIPPED_TRACES)
    assert sorted(f for f in os.listdir(SHIPPED_TRACES_DIR) if f.endswith(".gz")) == sorted(
        f"{n}_trace.jsonl.gz" for n in SHIPPED_TRACES)
    for name, digest in recorded.items():
        with gzip.open(os.path.join(SHIPPED_TRACES_DIR, name + ".gz"), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, name
    assert os.path.getsize(os.path.join(SHIPPED_TRACES_DIR, "LICENSE")) > 10000  # the Apache-2.0 text


@pytest.mark.parametrize("compress", [gzip.compress, lzma.compress])
def test_compressed_traces_read_like_plain_ones(tmp_path, compress):
    plain = load_trace(write_trace(tmp_path / "p_trace.jsonl", ROWS))
    data = compress((tmp_path / "p_trace.jsonl").read_bytes())
    suffix = ".gz" if compress is gzip.compress else ".xz"
    named = tmp_path / ("c_trace.jsonl" + suffix)
    named.write_bytes(data)
    unnamed = tmp_path / "u.jsonl"  # told by its first bytes, not its name
    unnamed.write_bytes(data)
    for path, name in ((named, "c"), (unnamed, "u")):
        t = load_trace(str(path))
        assert t.name == name
        assert (t.timestamps_ms, t.input_lengths, t.output_lengths, t.hash_ids) == (
            plain.timestamps_ms, plain.input_lengths, plain.output_lengths, plain.hash_ids)


def _wrong_crc(data: bytes) -> bytes:
    """gzip of `data` with its CRC-32 trailer flipped (the data itself intact)."""
    z = gzip.compress(data)
    return z[:-8] + bytes(b ^ 0xFF for b in z[-8:-4]) + z[-4:]


@pytest.mark.parametrize("make, message", [
    (lambda data: gzip.compress(data)[:-12], "corrupt or truncated compressed file"),
    (lambda data: lzma.compress(data)[:-20], "corrupt or truncated compressed file"),
    (lambda data: b"\x1f\x8b" + b"\x00" * 30, "corrupt or truncated compressed file"),
    (_wrong_crc, r"corrupt or truncated compressed file \(CRC check failed"),
    (lambda data: gzip.compress(b"\xff\xfe" + data), "not a UTF-8 text file"),
    (lambda data: gzip.compress(data + b"{oops\n"), r"x\.jsonl\.gz:3: not valid JSON"),
])
def test_damaged_compressed_traces_are_clear_errors(tmp_path, make, message):
    src = write_trace(tmp_path / "src.jsonl", ROWS)
    path = tmp_path / "x.jsonl.gz"
    with open(src, "rb") as f:
        path.write_bytes(make(f.read()))
    with pytest.raises(ToolError, match=message):
        load_trace(str(path))


def test_merge_offsets_ids_and_orders_by_time():
    a = make_trace([[0, 1], [0, 2]], name="a", timestamps=[0, 20])
    b = make_trace([[0], [0, 1]], name="b", timestamps=[10, 20])
    m = merge_traces([a, b])
    assert m.name == "a+b"
    assert m.timestamps_ms == [0, 10, 20, 20]
    # a's ids stay, b's are offset past a's largest id (2); the tie at 20 keeps trace order.
    assert m.hash_ids == [[0, 1], [3], [0, 2], [3, 4]]
    assert merge_traces([a]) is a


def test_merge_rejects_mixed_block_sizes():
    with pytest.raises(ToolError, match="block sizes"):
        merge_traces([make_trace([[0]], block_size=512), make_trace([[0]], block_size=256)])
