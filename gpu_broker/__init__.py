"""The GPU broker: leases the host's accelerators to the inference and training services."""
