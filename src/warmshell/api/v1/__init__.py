"""Generated protobuf and gRPC stubs (do not edit)."""
