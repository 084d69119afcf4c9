"""Dummy clients and ``mooncake_client``: the two ends of StandaloneClientService (mooncake_master.proto).

A ``mooncake_client`` (service.py) owns a memory pool in the store and answers ``DescribeClient`` on its
``--port`` (default 50052): the master it serves, the Transfer Engine metadata and protocol, its segment.
``setup_dummy(mem_pool_size, local_buffer_size, server_address)`` (store.py) asks it once (``dummy_config``)
and then sets up as a client without a segment of its own (``global_segment_size`` 0) against that master:
its puts land in the store's pool, which outlives the dummy. Unlike Mooncake's dummy client, which forwards
every call to the real client over RPC and shared memory, this one moves its data itself (Transfer Engine
transfers straight between its registered memory and the pool, a memcpy through the pool's memfd on the same
host); the service is consulted only at setup, so a dummy keeps working while the master does, and
``mem_pool_size`` bytes of registered memory of its own back ``alloc_from_mem_pool``.

Errors (logged): a bad ``server_address`` or size gives INVALID_PARAMS (-600), a service that cannot be
reached RPC_FAIL (-900), one that does not answer in time RPC_TIMEOUT (-901).
"""

from __future__ import annotations

import logging
import os
import socket

import grpc

from mooncake.store.client.config import SetupConfig, parse_size
from mooncake.store.common.errors import ErrorCode
from mooncake.store.common.fast_rpc import FastRpcClient, FastRpcServer
from mooncake.store.proto import mooncake_master_pb2 as pb

_log = logging.getLogger("mooncake.store.client")
SERVICE = "StandaloneClientService"
DEFAULT_PORT = 50052


def split_host_port(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"; ValueError otherwise."""
    host, sep, port = address.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"server_address must be 'host:port', got {address!r}")
    return host, int(port)


def dummy_config(mem_pool_size, local_buffer_size, server_address: str) -> tuple[SetupConfig | None, int, int]:
    """(config, mem_pool_size in bytes, code): the setup of a dummy client of the service at `server_address`,
    or (None, 0, negative code) with the reason logged."""
    try:
        pool, buffer = parse_size(mem_pool_size), parse_size(local_buffer_size)
        host, port = split_host_port(server_address)
    except ValueError as e:
        _log.error("setup_dummy: %s", e)
        return None, 0, int(ErrorCode.INVALID_PARAMS)
    timeout = float(os.environ.get("MC_RPC_CONNECT_TIMEOUT_MS", 5000)) / 1000
    try:
        with socket.create_connection((host, port), timeout=timeout) as probe:
            local_ip = probe.getsockname()[0]  # this host's address towards the service: the engine's name
    except OSError as e:
        _log.error("setup_dummy: no mooncake_client at %s (%s); start one with --port %d", server_address, e, port)
        return None, 0, int(ErrorCode.RPC_FAIL)
    client = FastRpcClient(host, port, timeout=timeout, service=SERVICE, connect_timeout=timeout)
    try:
        info = client.call("DescribeClient", pb.DescribeClientRequest())
    except grpc.RpcError as e:
        code = ErrorCode.RPC_TIMEOUT if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else ErrorCode.RPC_FAIL
        _log.error("setup_dummy: %s did not describe its store (%s): is it a mooncake_client?", server_address,
                   e.details())
        return None, 0, int(code)
    finally:
        client.close()
    cfg = SetupConfig(local_hostname=local_ip, metadata_server=info.metadata_server, global_segment_size=0,
                      local_buffer_size=buffer, protocol=info.protocol or "tcp",
                      master_server_addr=info.master_server_addr)
    _log.info("setup_dummy: store of %s (pool %s, %d bytes), master %s", server_address, info.segment_name,
              info.global_segment_size, info.master_server_addr)
    return cfg, pool, 0


class DescribeServer:
    """The service side: answers DescribeClient with `reply` on host:port (0: ephemeral; ``port`` is the one
    bound). The constructor raises OSError when the port cannot be bound; ``stop`` closes it (idempotent)."""

    def __init__(self, reply: pb.DescribeClientReply, host: str = "0.0.0.0", port: int = DEFAULT_PORT) -> None:
        self._reply = reply
        self._server = FastRpcServer(self, host, port, service=SERVICE, thread_name="mooncake-client-rpc")
        self.port = self._server.port

    def DescribeClient(self, request, context) -> pb.DescribeClientReply:  # noqa: N802 (the RPC's name)
        return self._reply

    def start(self) -> "DescribeServer":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
