#!/usr/bin/env bash
# Builds the Transfer Engine extension (mooncake._native) for another Python and puts it beside the package
# sources (python/mooncake/_native<EXT_SUFFIX>, git-ignored), with the CUDA platform, nvlink_intra and file (GDS)
# plugins from the same build in
# python/mooncake/_plugins/ (git-ignored; the loader looks there, and the build ids match), so that interpreter
# can import mooncake from this tree: e.g. the GPU machine's Python for ep/cuda/gpu_check.py (carry both there).
# It also installs the C++ conformance suite's tcp_conformance_test and its conformance_peer, linked statically
# (--dynamic_mode=off: no Bazel solib tree needed), in python/mooncake/_plugins/conformance/, where
# tools/gpu_check/gpu_check.py's conformance check finds them (with the cuda platform plugin one level up).
#
#   ci/build_native.sh /path/to/python3      # that Python needs nanobind (pip install nanobind==3.1.0)
#
# Uses its own Bazel output base (under /tmp) so the main build's cache stays valid.
set -euo pipefail
python="${1:?usage: ci/build_native.sh /path/to/python3}"
root="$(cd "$(dirname "$0")/.." && pwd)"
suffix="$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
"$python" -c 'import nanobind' 2>/dev/null || { echo "error: $python has no nanobind (pip install nanobind==3.1.0)" >&2; exit 1; }
tag="$("$python" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
cd "$root"
bazel --output_base="/tmp/mooncake-bazel-$tag" build --symlink_prefix=/ --repo_env=PYTHON_BIN_PATH="$python" \
  --dynamic_mode=off \
  //python:mooncake/_native.so //transfer_engine/platform/cuda:libmc_platform_cuda.so \
  //transfer_engine/transport/nvlink_intra:libmc_transport_nvlink_intra.so \
  //transfer_engine/transport/nvlink:libmc_transport_nvlink.so \
  //transfer_engine/transport/file:libmc_transport_file.so \
  //transfer_engine/transport/tcp:tcp_conformance_test \
  //transfer_engine/transport/conformance:conformance_peer  # no bazel-* links: they belong to the main build
bin="$(bazel --output_base="/tmp/mooncake-bazel-$tag" info --repo_env=PYTHON_BIN_PATH="$python" bazel-bin)"
install -m 0755 "$bin/python/mooncake/_native.so" "python/mooncake/_native$suffix"
install -d python/mooncake/_plugins
install -m 0755 "$bin/transfer_engine/platform/cuda/libmc_platform_cuda.so" \
  "$bin/transfer_engine/transport/nvlink_intra/libmc_transport_nvlink_intra.so" \
  "$bin/transfer_engine/transport/nvlink/libmc_transport_nvlink.so" \
  "$bin/transfer_engine/transport/file/libmc_transport_file.so" python/mooncake/_plugins/
install -d python/mooncake/_plugins/conformance
install -m 0755 "$bin/transfer_engine/transport/tcp/tcp_conformance_test" \
  "$bin/transfer_engine/transport/conformance/conformance_peer" python/mooncake/_plugins/conformance/
bazel --output_base="/tmp/mooncake-bazel-$tag" shutdown  # its server is not needed any more
echo "built python/mooncake/_native$suffix and python/mooncake/_plugins/ (cuda platform, nvlink_intra, nvlink and file transports;
conformance/: tcp_conformance_test, conformance_peer)"
