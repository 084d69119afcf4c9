#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine for building and testing the monorepo:
#   1. the Debian packages listed in ci/apt-packages.txt;
#   2. .venv/ (Python 3.11) holding exactly ci/requirements.lock (pinned, with hashes).
# Re-running it does nothing when both are already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[setup] $*" >&2; }

mapfile -t packages < <(grep -vE '^\s*(#|$)' ci/apt-packages.txt)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  for candidate in python3.11 "$HOME/.pyenv/versions/3.11.7/bin/python3" python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      python="$(command -v "$candidate")"; break
    fi
  done
fi
[[ -n "$python" ]] || { log "error: Python 3.11 not found (set PYTHON=/path/to/python3.11)"; exit 1; }

lock_sum="$(sha256sum ci/requirements.lock | cut -d' ' -f1)"
stamp=.venv/.requirements.sha256
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$lock_sum" ]]; then
  log "creating .venv with $python from ci/requirements.lock"
  rm -rf .venv
  "$python" -m venv .venv
  # grep drops pip's notes about this machine's optional local package mirrors.
  .venv/bin/python -m pip install -q --require-hashes --no-deps -r ci/requirements.lock 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
  echo "$lock_sum" > "$stamp"
fi
log "ready: $(.venv/bin/python --version), bazel $(command -v bazel)"
