"""The inference service. Contract in proto/diffusion/v1/inference.proto; the engine lands with its own issue."""
