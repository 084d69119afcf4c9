#!/bin/sh
# Bazel's coverage tools cannot be fetched offline; use gcov or pytest-cov outside Bazel instead.
echo "coverage unavailable offline" >&2
exit 1
