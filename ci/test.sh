#!/usr/bin/env bash
# Sets up the machine (ci/setup.sh), runs every C++ and Python test with `bazel test //...`, and ends with one
# plain line "N passed, N failed[, N skipped]" counting individual test cases (GoogleTest and pytest).
# Extra arguments go to `bazel test` (e.g. ci/test.sh //transfer_engine/...).
set -uo pipefail
cd "$(dirname "$0")/.."
./ci/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

targets=("$@")
((${#targets[@]})) || targets=(//...)
bazel test "${targets[@]}"
rc=$?

.venv/bin/python ci/count_results.py bazel-testlogs "$rc"
count_rc=$?
[[ "${CI:-}" == "true" ]] && bazel shutdown >/dev/null 2>&1
# Bazel: 0 all passed, 3 some tests failed, 1 build failed, 4 no tests found.
if ((rc != 0)); then exit "$rc"; fi
exit "$count_rc"
