"""Generated from proto/diffusion by tools/gen_stubs.py. Do not edit."""
