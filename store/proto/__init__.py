"""Generated protobuf/gRPC modules of the store (built by //store/proto:master_proto)."""
