"""Smoke run of the store-vs-Redis benchmark (tiny iteration counts): every section runs and reports."""

from mooncake.store.client import bench


def test_bench_smoke():
    out = bench.run(iters=5, sizes=[4096, 1 << 20], seconds=0.2, remote_segment="256MB", local_segment="128MB")
    assert [(s["size"], s["where"]) for s in out["sizes"]] == [(4096, "remote"), (4096, "local"),
                                                               (1 << 20, "remote"), (1 << 20, "local")]
    assert out["ops_4KiB_remote"]["store_get"] > 0 and out["get_into_local"][0]["ratio"] > 0
    text = bench.report(out)
    assert "Redis GET" in text and "memcpy" in text and "HTTP metadata" in text and "layer-wise load" in text
    assert out["bytes_vs_zero_copy_http"]["put"]["p50_us"] > 0
    w = out["layerwise_remote"]
    assert w["layers"] == 64 and w["session"]["p50_us"] > 0 and w["cold_vs_session"] > 0


def test_bench_sections():
    out = bench.run(iters=3, sizes=[4096], seconds=0.1, remote_segment="64MB", local_segment="64MB",
                    sections=["layerwise"], layers=4)
    assert out["sizes"] == [] and set(out) == {"sizes", "iters", "layerwise_remote"}
    assert out["layerwise_remote"]["layers"] == 4 and "layer-wise load, 4 layers" in bench.report(out)
