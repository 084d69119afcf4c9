#!/usr/bin/env bash
# The main job on an embedded, single-machine default: set up, build, then move and verify >= 1 GiB between
# two Transfer Engine processes over TCP on 127.0.0.1 (embedded HTTP metadata server), printing a table.
# Extra arguments go to transfer_engine_bench (e.g. --mode compare for the benchmark against a raw socket).
set -euo pipefail
cd "$(dirname "$0")/.."
./ci/setup.sh
bazel build //python:transfer_engine_bench
exec bazel-bin/python/transfer_engine_bench "$@"
