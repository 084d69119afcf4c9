#!/bin/bash
# Runs the efa benchmark over both software providers: tcp;ofi_rxm (against the tcp transport and a raw
# socket) and shm (against memcpy; also with MC_EFA_IDLE_POLL_US=50). Each provider runs in its own process (libfabric reads FI_PROVIDER once).
set -euo pipefail
bin="$(dirname "$0")/efa_bench_bin"
[[ -x "$bin" ]] || bin="transfer_engine/transport/efa/efa_bench_bin"
export MC_LOG_LEVEL="${MC_LOG_LEVEL:-WARNING}"
peer="transfer_engine/transport/conformance/conformance_peer"
if [[ -z "${MC_CONFORMANCE_PEER:-}" && -x "$peer" ]]; then export MC_CONFORMANCE_PEER="$PWD/$peer"; fi
"$bin" --provider='tcp;ofi_rxm'
"$bin" --provider=shm
# shm needs the target's progress, which polls: the same with 50 us naps instead of 1 ms.
MC_EFA_IDLE_POLL_US=50 "$bin" --provider=shm
