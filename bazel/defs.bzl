"""Project macros (mc_ prefix): Python tests run by pytest inside Bazel."""

def mc_py_test(name, srcs, deps = [], data = [], args = [], size = "small", tags = [], **kwargs):
    """A py_test that runs pytest on `srcs` (test files named *_test.py).

    Args:
      name: target name.
      srcs: the test files (and helpers they import).
      deps: py_library deps.
      data: runtime data files.
      args: extra pytest options (e.g. ["-k", "fast"]).
      size: Bazel test size; sets the default timeout.
      tags: Bazel tags.
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
        tags = tags,
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )
