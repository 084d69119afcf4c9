import pytest

from mooncake.tools.common import ToolError
from mooncake.tools.testutil import make_trace, write_trace
from mooncake.tools.trace import TRACES_DIR_ENV, load_trace, merge_traces, resolve_trace_path


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
    with pytest.raises(ToolError, match="MOONCAKE_TRACES_DIR"):
        resolve_trace_path("other")


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
