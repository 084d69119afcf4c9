#!/usr/bin/env bash
# Regenerates ci/requirements.lock (pinned, hashed) from ci/requirements.in with pip-tools in a scratch venv.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3.11 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install -q pip-tools
"$scratch/venv/bin/pip-compile" -q --generate-hashes --allow-unsafe --strip-extras \
  --find-links /opt/wheels --output-file ci/requirements.lock ci/requirements.in
