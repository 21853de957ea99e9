"""The inference service: loads diffusion pipelines and generates images. Contract in proto/diffusion/v1/inference.proto."""
