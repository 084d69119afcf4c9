"""CUDA build macros (compile-only on machines without a GPU; see bazel/local_cuda.bzl)."""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "NVCC")

# Hopper (H100/H200) natively, Ampere natively, and PTX for newer parts.
CUDA_ARCH_FLAGS = " ".join([
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=[sm_90,compute_90]",
])

def mc_cuda_shared_library(name, srcs, hdrs = [], **kwargs):
    """A shared library `name` (e.g. "libfoo.so") of .cu sources with the CUDA runtime linked in statically,
    so it loads with ctypes on any machine that has a driver. Without a toolkit, `name` is an empty filegroup
    and the loader says the library was not built.

    Args:
      name: the .so file name.
      srcs: .cu files (each compiled by nvcc into a PIC object).
      hdrs: headers the .cu files include.
      **kwargs: passed to the final cc_binary (visibility, tags).
    """
    if not HAS_CUDA:
        native.filegroup(name = name, srcs = [], **kwargs)
        return
    objects = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", "") + ".pic.o"
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = NVCC + " -c -O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden " + CUDA_ARCH_FLAGS +
                  " $(location %s) -o $@" % src,
        )
        objects.append(obj)
    native.cc_library(
        name = name + "_objects",
        srcs = objects,
        deps = ["@local_cuda//:cudart_static"],
        alwayslink = True,
    )
    native.cc_binary(
        name = name,
        linkshared = True,
        linkstatic = True,
        deps = [name + "_objects"],
        linkopts = ["-Wl,--exclude-libs,ALL"],
        **kwargs
    )
