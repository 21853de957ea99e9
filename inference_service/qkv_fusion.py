"""Fused attention projections (SPEED_MODE_MAX): one linear for q, k and v, without a second copy of their weights,
and split again before an adapter.

diffusers' fusion (each attention's `fuse_projections`, which `fuse_qkv_projections` calls on them all) concatenates
its q, k and v weights (and the added, text-side ones) into new linears and keeps the separate ones, which attention
then no longer calls: on FLUX.1 that is 2.15 billion parameters (4.3 GB in bf16) held twice, outside what the
model's lease counts. Here the separate linears' weights and biases become views of the fused ones, so the model
holds each weight once. They stay whole modules, because an adapter's layers sit on them: `split` returns attention
to them (their views keep the fused storage alive, so splitting frees nothing and copies nothing).
"""
from __future__ import annotations

# the fused linear, and the separate ones it concatenates, in diffusers' attention modules
FUSED = {"to_qkv": ("to_q", "to_k", "to_v"), "to_kv": ("to_k", "to_v"),
         "to_added_qkv": ("add_q_proj", "add_k_proj", "add_v_proj")}


def fuse(denoiser) -> bool:
    """Fuses every attention's projections where the model supports it, one attention at a time (so a load holds
    one attention's weights twice at most, not every one's); False where it has none to fuse."""
    if not hasattr(denoiser, "fuse_qkv_projections"):
        return False
    fused = False
    for module in list(denoiser.modules()):
        if getattr(module, "_supports_qkv_fusion", False) and hasattr(module, "fuse_projections"):
            module.fuse_projections()
        if getattr(module, "fused_projections", False):
            fused = True
            for name, parts in FUSED.items():
                if hasattr(module, name):
                    _share(getattr(module, name), [getattr(module, p) for p in parts])
    return fused


def split(denoiser) -> bool:
    """Attention calls the separate projections again; False where nothing was fused."""
    if not any(True for _ in _fused_modules(denoiser)):
        return False
    denoiser.unfuse_qkv_projections()
    return True


def _fused_modules(denoiser):
    return (m for m in denoiser.modules() if getattr(m, "fused_projections", False))


def _share(fused, parts) -> None:
    """Each of `parts` (linears) takes its rows of `fused`'s weight and bias as views, in place of its own copy."""
    import torch

    sizes = [p.out_features for p in parts]
    for part, weight in zip(parts, fused.weight.detach().split(sizes)):
        part.weight = torch.nn.Parameter(weight, requires_grad=part.weight.requires_grad)
    if fused.bias is not None:
        for part, bias in zip(parts, fused.bias.detach().split(sizes)):
            part.bias = torch.nn.Parameter(bias, requires_grad=part.bias.requires_grad)
