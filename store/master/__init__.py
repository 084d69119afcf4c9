"""The Mooncake Store master: object metadata, segment allocators, leases, eviction, client liveness.

Modules: ``errors`` (codes), ``allocator`` (offset allocator), ``segments`` (mounted segments, placement),
``objects`` (object table, leases, pins), ``eviction`` (victim selection), ``liveness`` (client TTLs),
``tasks`` (copy/move task queue), ``service`` (the thread-safe core), ``replication`` (copy/move/clear),
``rpc_server`` (gRPC), ``master_client`` (thin gRPC client), ``metrics`` / ``admin_http`` (Prometheus,
health, status), ``config`` / ``cli`` (``mooncake_master``).
"""
