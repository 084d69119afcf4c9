"""Project macros (mc_ prefix): Python tests run by pytest inside Bazel."""

def mc_py_test(name, srcs, deps = [], data = [], args = [], size = "small", tags = [], own_network = True, **kwargs):
    """A py_test that runs pytest on `srcs` (test files named *_test.py).

    By default each test runs in its own network namespace with only loopback ("block-network"), so tests
    running in parallel never race for the same 127.0.0.1 port.

    Args:
      name: target name.
      srcs: the test files (and helpers they import).
      deps: py_library deps.
      data: runtime data files.
      args: extra pytest options (e.g. ["-k", "fast"]).
      size: Bazel test size; sets the default timeout.
      tags: Bazel tags.
      own_network: run in a private network namespace (set False for tests that build namespaces themselves).
      **kwargs: passed to py_test (e.g. timeout, shard_count, env).
    """
    test_files = [s for s in srcs if s.endswith("_test.py")]
    native.py_test(
        name = name,
        srcs = srcs + ["//bazel:pytest_main.py"],
        main = "//bazel:pytest_main.py",
        deps = deps,
        data = data,
        args = args + ["--"] + ["$(location %s)" % f for f in test_files],
        size = size,
        tags = tags + (["block-network"] if own_network else []),
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )
