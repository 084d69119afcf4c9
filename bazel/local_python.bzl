"""Wires the project's Python (default: <workspace>/.venv, else $PYTHON_BIN_PATH) into Bazel.

Generates @local_python with:
  :py_toolchain      py_runtime with an absolute interpreter and shebang (works under strict action env)
  :python_headers    the interpreter's C headers
  :nanobind          nanobind's amalgamated sources from the venv (when installed)
  defs.bzl           PYTHON, EXT_SUFFIX, PY_VERSION, PY_TAG
"""

_PROBE = """
import os, sys, sysconfig
print(sys.executable)
print(sysconfig.get_paths()["include"])
print(sysconfig.get_config_var("EXT_SUFFIX"))
print("%d.%d" % sys.version_info[:2])
try:
    import nanobind
    print(os.path.dirname(nanobind.__file__))
except ImportError:
    print("")
"""

def _impl(rctx):
    python = rctx.os.environ.get("PYTHON_BIN_PATH", "")
    if not python:
        venv_python = rctx.path(Label("//:WORKSPACE")).dirname.get_child(".venv").get_child("bin").get_child("python3")
        if not venv_python.exists:
            fail("No Python found: run ci/setup.sh (creates .venv) or set PYTHON_BIN_PATH.")
        python = str(venv_python)
    res = rctx.execute([python, "-c", _PROBE])
    if res.return_code != 0:
        fail("Python probe failed with %s:\n%s" % (python, res.stderr))
    lines = res.stdout.split("\n")
    exe, include, ext_suffix, version, nb_dir = (lines + [""] * 5)[:5]

    # Keep the venv's path (not the resolved base interpreter): site-packages come from the venv.
    exe = python
    rctx.symlink(include, "python_include")
    build = """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{exe}",
    python_version = "PY3",
    stub_shebang = "#!{exe}",
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(exe = exe)
    if nb_dir:
        rctx.symlink(nb_dir, "nanobind")
        build += """
cc_library(
    name = "nanobind",
    srcs = ["nanobind/src/nb_combined.cpp"],
    hdrs = glob([
        "nanobind/include/**/*.h",
        "nanobind/ext/robin_map/include/**/*.h",
    ]),
    copts = [
        "-fno-strict-aliasing",
        "-fvisibility=hidden",
        "-O2",
        "-w",
    ],
    includes = [
        "nanobind/include",
        "nanobind/ext/robin_map/include",
    ],
    textual_hdrs = glob(
        [
            "nanobind/src/*.cpp",
            "nanobind/src/*.h",
        ],
        exclude = ["nanobind/src/nb_combined.cpp"],
    ),
    deps = [":python_headers"],
)
"""
    rctx.file("BUILD.bazel", build)
    py_tag = "cp" + version.replace(".", "")
    rctx.file("defs.bzl", "PYTHON = %r\nEXT_SUFFIX = %r\nPY_VERSION = %r\nPY_TAG = %r\nHAS_NANOBIND = %r\n" %
                          (exe, ext_suffix, version, py_tag, bool(nb_dir)))

local_python_configure = repository_rule(
    implementation = _impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
