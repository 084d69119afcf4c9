"""Wires a local CUDA toolkit (nvcc, headers, static cudart) into Bazel, or an empty stand-in without one.

Generates @local_cuda with:
  :cudart_static   libcudart_static.a and the CUDA headers (only when a toolkit was found)
  defs.bzl         HAS_CUDA (bool), NVCC (absolute path or ""), CUDA_REASON (why there is no CUDA, or "")

The toolkit is $CUDA_HOME, else /usr/local/cuda. Nothing here needs a GPU or a driver: code is compiled and
linked only; running it needs a machine with a driver (see ep/cuda/gpu_check.py).
"""

def _impl(rctx):
    home = rctx.os.environ.get("CUDA_HOME", "") or "/usr/local/cuda"
    nvcc = rctx.path(home + "/bin/nvcc")
    static = rctx.path(home + "/lib64/libcudart_static.a")
    if not nvcc.exists or not static.exists:
        reason = "no CUDA toolkit at %s (set CUDA_HOME)" % home
        rctx.file("BUILD.bazel", "")
        rctx.file("defs.bzl", "HAS_CUDA = False\nNVCC = \"\"\nCUDA_REASON = %r\n" % reason)
        return
    rctx.symlink(home + "/include", "include")
    rctx.symlink(static, "lib/libcudart_static.a")
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cudart_static",
    srcs = ["lib/libcudart_static.a"],
    hdrs = glob(["include/*.h"]),
    includes = ["include"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
)
""")
    rctx.file("defs.bzl", "HAS_CUDA = True\nNVCC = %r\nCUDA_REASON = \"\"\n" % str(nvcc))

local_cuda_configure = repository_rule(
    implementation = _impl,
    environ = ["CUDA_HOME"],
    local = True,
)
