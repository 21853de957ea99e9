"""What the inference and training services share: the family registry, host probes, tiny pipelines."""
