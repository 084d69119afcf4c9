"""Entry point of every mc_py_test: runs pytest on the test files given as arguments.

Bazel passes the test files (runfiles-relative) after `--`; extra pytest options come before it.
"""

import os
import sys

import pytest


def main() -> int:
    args = sys.argv[1:]
    split = args.index("--") if "--" in args else 0
    options, files = args[:split], args[split + 1 if split else 0:]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        options.append("--junitxml=" + xml)
    # Bazel's sandbox is read-only in places pytest likes to write.
    options += ["-p", "no:cacheprovider", "-q", "-rs"]
    return pytest.main(options + files)


if __name__ == "__main__":
    sys.exit(main())
