"""``mooncake_client``: a standalone store process that owns a memory pool and keeps it in the store.

The cache then survives restarts of inference processes: they set up with ``global_segment_size=0`` (they
contribute no memory) and their puts land in this process's segment. The service mounts its segment with
the master, keeps it alive with the heartbeat (re-mounting after a master restart) and unmounts it on
SIGINT/SIGTERM. On --port (Mooncake's flag, default 50052; 0: any free port) it answers dummy clients
(``setup_dummy(mem_pool_size, local_buffer_size, "<host>:<port>")``, standalone.py), which learn from it which
store to join. It prints one line once ready: ``mooncake_client ready: segment <name> size <bytes> master
<addr> port <port>`` (then `` ssd <dir>`` with an SSD tier). Exit status: 0 after a signal, 1 when setup
failed or the port cannot be bound (the reason is logged).

Flags (Mooncake's names where they exist): --master_server_address (127.0.0.1:50051), --host / local
hostname (MOONCAKE_LOCAL_HOSTNAME, else 127.0.0.1), --metadata_server (P2PHANDSHAKE), --protocol (tcp),
--device_names (""), --global_segment_size (4GB; human-readable sizes), --local_buffer_size (0),
--enable_offload (false; alias --enable_ssd_offload) with --ssd_offload_path (else
MOONCAKE_OFFLOAD_FILE_STORAGE_PATH): an SSD tier that persists every object of the pool, whoever wrote it
(the master hands this process the objects committed to its segment; see store/README.md), and serves the
files to readers; they stay readable after eviction from memory and across restarts of this process.
--enable_client_http_server (false) with --client_http_port (9300): Prometheus /metrics and /health
(http_server.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading


def _bool(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mooncake_client", description=__doc__.split("\n\n")[0])
    p.add_argument("--master_server_address", default="127.0.0.1:50051")
    p.add_argument("--port", type=int, default=50052, help="where dummy clients (setup_dummy) connect; 0: any")
    p.add_argument("--host", default=os.environ.get("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1"))
    p.add_argument("--metadata_server", default="P2PHANDSHAKE")
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--device_names", default="")
    p.add_argument("--global_segment_size", default="4GB")
    p.add_argument("--local_buffer_size", default="0")
    p.add_argument("--enable_offload", "--enable_ssd_offload", dest="enable_offload", type=_bool, nargs="?",
                   const=True, default=False, metavar="BOOL")
    p.add_argument("--ssd_offload_path", default="")
    p.add_argument("--enable_client_http_server", type=_bool, nargs="?", const=True, default=False, metavar="BOOL",
                   help="serve Prometheus /metrics and /health on --client_http_port")
    p.add_argument("--client_http_port", type=int, default=9300)
    p.add_argument("--log_level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mooncake.store.client.standalone import DescribeServer
    from mooncake.store.client.store import MooncakeDistributedStore
    from mooncake.store.proto import mooncake_master_pb2 as pb

    store = MooncakeDistributedStore()
    code = store.setup(args.host, args.metadata_server, args.global_segment_size, args.local_buffer_size,
                       args.protocol, args.device_names, args.master_server_address,
                       enable_ssd_offload=args.enable_offload, ssd_offload_path=args.ssd_offload_path,
                       enable_client_http_server=args.enable_client_http_server,
                       client_http_port=args.client_http_port)
    if code != 0:
        print(f"mooncake_client: error: setup failed ({code}); see the log above", file=sys.stderr)
        return 1
    info = pb.DescribeClientReply(master_server_addr=args.master_server_address,
                                  metadata_server=args.metadata_server, protocol=args.protocol,
                                  segment_name=store.get_hostname(), global_segment_size=store._global[1])
    try:
        server = DescribeServer(info, port=args.port).start()
    except (OSError, OverflowError) as e:
        print(f"mooncake_client: error: cannot listen on --port {args.port} for dummy clients: {e}", file=sys.stderr)
        store.close()
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ssd = f" ssd {store._disk.path}" if store._disk is not None else ""
    print(f"mooncake_client ready: segment {store.get_hostname()} size {store._global[1]} master "
          f"{args.master_server_address} port {server.port}{ssd}", flush=True)
    while not stop.wait(1.0):
        pass
    server.stop()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
