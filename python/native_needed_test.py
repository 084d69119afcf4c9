"""_native.so NEEDs no vendor library: only the C/C++ runtime and libcurl (the HTTP/etcd metadata client, a
documented system dependency). CUDA, HIP, CANN, MUSA, verbs and libfabric are dlopen'ed by plugins at run time,
so `import mooncake.engine` works on any host whatever the wheel carries."""

import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(HERE, "mooncake", "_native.so")

ALLOWED = {
    "libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1",
    "ld-linux-x86-64.so.2",
    "libcurl.so.4",  # system package (Debian libcurl4), named in README's install section
}
# Names a NEEDED entry must never contain, whatever the allow-list above says (the message names the culprit).
VENDOR = re.compile(r"libcuda|libcudart|libnvidia|libnccl|libcufile|libamdhip|libhsa|librocm|libascend|libacl|"
                    r"libhccl|libmusa|libibverbs|librdmacm|libmlx|libefa|libfabric|libnuma")


def _needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_native_needs_only_the_runtime():
    needed = _needed(NATIVE)
    assert "libc.so.6" in needed, f"readelf found no NEEDED entries in {NATIVE}: {needed}"
    vendor = [n for n in needed if VENDOR.search(n)]
    assert not vendor, f"_native.so NEEDs vendor libraries {vendor}; they must be dlopen'ed by a plugin"
    assert set(needed) <= ALLOWED, f"_native.so NEEDs {sorted(set(needed) - ALLOWED)} beyond {sorted(ALLOWED)}"


def test_the_check_sees_a_vendor_dependency():
    # The same parse on a line as readelf prints it for a library that does NEED libcuda.
    line = " 0x0000000000000001 (NEEDED)             Shared library: [libcuda.so.1]"
    found = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", line)
    assert found == ["libcuda.so.1"] and VENDOR.search(found[0])
