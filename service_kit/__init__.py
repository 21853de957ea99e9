"""Small pieces every service shares: domain errors, their gRPC mapping, the server runtime, logs."""
