"""marble daemon: job specs, job store, the policy adapter, the scheduling loop and its gRPC service."""
