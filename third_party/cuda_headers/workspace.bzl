"""@cuda_headers: the CUDA driver API headers (cuda.h, cudaTypedefs.h) of each CUDA major version found, and no
library: code built against them resolves the driver at run time (transfer_engine/platform/cuda).

Generates:
  :cuda12, :cuda13   cc_library with that major version's headers (only for the versions found)
  :cufile            cc_library with cufile.h (cuFile / GPUDirect Storage), when found
  defs.bzl           CUDA_HEADER_MAJORS (sorted list of ints), CUDA_HEADER_SOURCES ({major: "VERSION at DIR"}),
                     CUDA_HEADERS_MISSING ({major: why not found}) for 12 and 13, CUFILE_HEADER (the cufile.h
                     used, "" when none was found)

Where headers are looked for, first match per major version wins:
  $CUDA_HOME/include, /usr/local/cuda/include     (the toolkit; CUDA 13 on the project's machines)
  <python site-packages>/nvidia/cuda_runtime/include   (pip nvidia-cuda-runtime-cu12, pinned in ci/requirements.lock)
  <python site-packages>/nvidia/cu13/include
cufile.h: $CUDA_HOME/include, /usr/local/cuda/include, then <site-packages>/nvidia/cufile/include (pip
nvidia-cufile-cu12, pinned in ci/requirements.lock).
The Python is $PYTHON_BIN_PATH, else <workspace>/.venv/bin/python3 (as @local_python).
"""

_WANTED = [12, 13]

_PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"

def _cuda_version(rctx, include_dir):
    header = rctx.path(include_dir + "/cuda.h")
    if not header.exists or not rctx.path(include_dir + "/cudaTypedefs.h").exists:
        return None
    for line in rctx.read(header).split("\n"):
        parts = [p for p in line.replace("\t", " ").split(" ") if p]
        if len(parts) >= 3 and parts[0] == "#define" and parts[1] == "CUDA_VERSION" and parts[2].isdigit():
            return int(parts[2])
    return None

def _python(rctx):
    python = rctx.os.environ.get("PYTHON_BIN_PATH", "")
    if python:
        return python
    venv = rctx.path(Label("//:WORKSPACE")).dirname.get_child(".venv").get_child("bin").get_child("python3")
    return str(venv) if venv.exists else ""

def _impl(rctx):
    candidates = []
    cufile_dirs = []
    home = rctx.os.environ.get("CUDA_HOME", "")
    if home:
        candidates.append(home + "/include")
    candidates.append("/usr/local/cuda/include")
    toolkit = list(candidates)
    python = _python(rctx)
    if python:
        res = rctx.execute([python, "-c", _PURELIB])
        if res.return_code == 0 and res.stdout.strip():
            site = res.stdout.strip()
            candidates.append(site + "/nvidia/cuda_runtime/include")
            candidates.append(site + "/nvidia/cu13/include")
            cufile_dirs.append(site + "/nvidia/cufile/include")

    found = {}
    for include_dir in candidates:
        version = _cuda_version(rctx, include_dir)
        if version == None:
            continue
        major = version // 1000
        if major in _WANTED and major not in found:
            found[major] = (version, include_dir)

    build = ["package(default_visibility = [\"//visibility:public\"])", ""]
    for major in sorted(found.keys()):
        version, include_dir = found[major]
        local = "cuda%d/include" % major
        rctx.symlink(include_dir + "/cuda.h", local + "/cuda.h")
        rctx.symlink(include_dir + "/cudaTypedefs.h", local + "/cudaTypedefs.h")
        build.append("""cc_library(
    name = "cuda{major}",
    hdrs = ["{local}/cuda.h", "{local}/cudaTypedefs.h"],
    includes = ["{local}"],
)
""".format(major = major, local = local))
    cufile = ""
    for include_dir in toolkit + cufile_dirs:
        if rctx.path(include_dir + "/cufile.h").exists:
            cufile = include_dir + "/cufile.h"
            break
    if cufile:
        rctx.symlink(cufile, "cufile/include/cufile.h")
        build.append("""cc_library(
    name = "cufile",
    hdrs = ["cufile/include/cufile.h"],
    includes = ["cufile/include"],
)
""")
    rctx.file("BUILD.bazel", "\n".join(build))
    sources = {m: "%d.%d at %s" % (found[m][0] // 1000, (found[m][0] % 1000) // 10, found[m][1]) for m in found}
    missing = {
        m: "no CUDA %d cuda.h + cudaTypedefs.h in %s" % (m, ", ".join(candidates))
        for m in _WANTED
        if m not in found
    }
    rctx.file("defs.bzl", "CUDA_HEADER_MAJORS = %r\nCUDA_HEADER_SOURCES = %r\nCUDA_HEADERS_MISSING = %r\nCUFILE_HEADER = %r\n" % (
        sorted(found.keys()),
        sources,
        missing,
        cufile,
    ))

cuda_headers_configure = repository_rule(
    implementation = _impl,
    environ = ["CUDA_HOME", "PYTHON_BIN_PATH"],
    local = True,
)
