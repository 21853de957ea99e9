"""The training service. Contract in proto/diffusion/v1/training.proto; the engine lands with its own issue."""
