"""What the store's master and clients share: error codes, wire limits, the offset allocator, the framed
protobuf RPC (fast_rpc) and the client side of the master's API (master_client, with leader discovery)."""
