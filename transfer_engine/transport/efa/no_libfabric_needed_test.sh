#!/bin/bash
# Usage: no_libfabric_needed_test.sh <elf file>...
# Fails when a file's dynamic section NEEDs libfabric (or another vendor library): the plugin dlopens
# libfabric.so.1 at run time, so it must load on hosts without it. A plugin file must export mc_plugin_v1.
set -euo pipefail
for f in "$@"; do
  needed="$(readelf -d "$f" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')"
  if ! grep -q '^libc\.so' <<<"$needed"; then
    echo "FAIL: $f: readelf found no NEEDED libc.so (not a dynamic ELF file?): $needed"
    exit 1
  fi
  if grep -Eq '^(libfabric|libefa|libibverbs|librdmacm)' <<<"$needed"; then
    echo "FAIL: $f NEEDs a vendor library:"
    grep -E '^(libfabric|libefa|libibverbs|librdmacm)' <<<"$needed"
    exit 1
  fi
  if ! readelf --dyn-syms -W "$f" | awk '$7 != "UND" {print $8}' | grep -qx 'mc_plugin_v1'; then
    echo "FAIL: $f does not export mc_plugin_v1"
    exit 1
  fi
  echo "ok: $f NEEDs only: $(tr '\n' ' ' <<<"$needed")"
done
