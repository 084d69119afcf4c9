"""mc_py_proto: Python protobuf + gRPC modules generated in the build with the venv's grpc_tools."""

load("@local_python//:defs.bzl", "PYTHON")

def mc_py_proto(name, src, deps = [], visibility = None):
    """Generates <stem>_pb2.py and <stem>_pb2_grpc.py from one .proto and wraps them in a py_library.

    The .proto is compiled with its own directory as the include root, so the generated modules belong to
    the Python package of that directory (e.g. store/proto -> mooncake.store.proto). protoc writes
    `import <stem>_pb2` in the gRPC module; it is rewritten to a relative import so the pair works both
    from the source tree / runfiles (mooncake.<component>...) and from an installed wheel.

    Args:
      name: py_library name.
      src: the .proto file (in this package; imports of other .proto files are not supported).
      deps: py_library deps (typically the package's __init__ library).
      visibility: visibility of the py_library.
    """
    if not src.endswith(".proto"):
        fail("mc_py_proto: src must be a .proto file, got %r" % src)
    stem = src[:-len(".proto")]
    if "/" in stem:
        fail("mc_py_proto: src must live in the package directory, got %r" % src)
    pb2 = stem + "_pb2.py"
    pb2_grpc = stem + "_pb2_grpc.py"
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = [pb2, pb2_grpc],
        cmd = ("%s -m grpc_tools.protoc -I$$(dirname $(location %s)) " % (PYTHON, src) +
               "--python_out=$(@D) --grpc_python_out=$(@D) $(location %s) && " % src +
               "sed -i 's/^import %s_pb2 as /from . import %s_pb2 as /' $(@D)/%s" % (stem, stem, pb2_grpc)),
        message = "Generating Python protobuf/gRPC modules for " + src,
    )
    native.py_library(
        name = name,
        srcs = [pb2, pb2_grpc],
        deps = deps,
        visibility = visibility,
    )
