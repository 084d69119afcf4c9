"""The benchmark runs end to end at a tiny scale and reports sane figures."""

import json

from mooncake.store.master import bench


def test_bench_small_run(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--seconds=0.3", "--clients=1,2", "--batch=8", "--threads=4", "--objects=3000",
                       "--alloc_ops=3000", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert "B/object (RSS)" in text and "echo_1c" in text and "batch_get_2c" in text
    r = json.loads(out.read_text())
    for name in ("echo_1c", "put_1c", "get_2c", "batch_put_2c", "exist_1c"):
        assert r["rpc"][name]["items_per_s"] > 0 and r["rpc"][name]["errors"] == {}, name
    assert r["rpc"]["batch_get_1c"]["items_per_s"] > r["rpc"]["batch_get_1c"]["rpcs_per_s"]
    assert 150 < r["memory_traced"]["heap_bytes_per_object"] < 1000  # the key alone is 113 B
    assert 0 <= r["allocator"]["fragmentation"] < 1 and r["allocator"]["fill_at_first_failure"] > 0.8
