"""The benchmark runs end to end (small sizes; the figures go to the test log, nothing is asserted on
speed: the machine is shared). Full run: `bazel run //pg:bench -- --world 2 4`."""

from mooncake.pg import bench


def test_bench_prints_both_backends():
    out = bench.main(["--world", "2", "--sizes", "4096", "1048576", "--rounds", "1"])
    print(out)
    for what in ("all_reduce", "all_gather", "barrier", "mooncake-cpu", "gloo"):
        assert what in out
