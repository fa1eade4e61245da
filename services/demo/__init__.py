"""A small multi-agent client: concurrent code and math workflows through the gRPC front door."""
