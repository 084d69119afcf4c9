"""Sums the JUnit XML files Bazel left under bazel-testlogs/ and prints 'N passed, N failed[, N skipped]'.

A test target without a result file (it failed to build or crashed before writing one) counts as one failure
when Bazel's exit code says something failed. Exit status: 1 when anything failed or no test ran, else 0.
"""

import os
import re
import sys
import xml.etree.ElementTree as ET


def count(root: str):
    passed = failed = skipped = 0
    for dirpath, dirs, files in os.walk(root, followlinks=True):
        # run_N_of_M/ folders are left over from earlier --runs_per_test invocations.
        dirs[:] = [d for d in dirs if not re.fullmatch(r"run_\d+_of_\d+", d)]
        if "test.xml" not in files:
            continue
        try:
            tree = ET.parse(os.path.join(dirpath, "test.xml"))
        except ET.ParseError:
            failed += 1
            continue
        for case in tree.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None or case.get("status") == "notrun":
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped


def main() -> int:
    root, bazel_rc = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    passed, failed, skipped = count(root) if os.path.isdir(root) else (0, 0, 0)
    if bazel_rc not in (0, 4) and failed == 0:
        failed = 1  # a build failure leaves no test.xml to count
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
