#!/bin/bash
# Usage: no_vendor_needed_test.sh <forbidden regex> <elf file>...
# Fails when any file's dynamic section NEEDs a library matching the regex (platforms dlopen their vendor
# library at run time; a NEEDED entry would make the file unloadable where the vendor library is absent).
# Plugin files (libmc_*.so) must also export the entry point mc_plugin_v1.
set -euo pipefail
forbidden="$1"
shift
for f in "$@"; do
  needed="$(readelf -d "$f" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')"
  if ! grep -q '^libc\.so' <<<"$needed"; then
    echo "FAIL: $f: readelf found no NEEDED libc.so (not a dynamic ELF file?): $needed"
    exit 1
  fi
  if grep -Eq "$forbidden" <<<"$needed"; then
    echo "FAIL: $f NEEDs a vendor library:"
    grep -E "$forbidden" <<<"$needed"
    exit 1
  fi
  case "$(basename "$f")" in
    libmc_*.so)
      if ! readelf --dyn-syms -W "$f" | awk '$7 != "UND" {print $8}' | grep -qx 'mc_plugin_v1'; then
        echo "FAIL: $f does not export mc_plugin_v1"
        exit 1
      fi
      ;;
  esac
  echo "ok: $f NEEDs only: $(tr '\n' ' ' <<<"$needed")"
done
