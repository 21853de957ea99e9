"""Frozen base linears with a quantised weight whose backward keeps the quantised weight.

torchao's weight-only int8 tensor dequantises inside `F.linear`, above autograd. Autograd then saves
the bf16 dequantised copy of every base weight for the backward pass, which costs a whole bf16 model
of extra memory. On an H200, Z-Image int8 peaked at 36.8 GiB per step against 31.4 GiB for bf16.

The base is frozen, so its backward needs only `grad_out @ W`. `FrozenQuantizedLinear` computes that
from the quantised weight, dequantising one layer at a time and freeing the copy straight away. The
forward is the same call as before, so outputs are unchanged. Gradients agree up to bf16 rounding,
because the scale is applied in a different order than in torchao's own backward.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


class _FrozenWeightLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.weight, ctx.x_dtype = weight, x.dtype  # a reference to the frozen parameter, not a saved copy
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        dense = ctx.weight.dequantize().to(grad_out.dtype)
        return grad_out.matmul(dense).to(ctx.x_dtype), None, None


class FrozenQuantizedLinear(torch.nn.Linear):
    """A frozen linear over a quantised weight tensor (one with `dequantize()`); same parameters, same names."""

    @classmethod
    def wrapping(cls, linear: torch.nn.Linear) -> "FrozenQuantizedLinear":
        if linear.weight.requires_grad or (linear.bias is not None and linear.bias.requires_grad):
            raise ValueError("only a frozen linear can drop its dense weight from the backward pass")
        if not hasattr(linear.weight, "dequantize") or type(linear.weight) in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(f"the weight is a dense {type(linear.weight).__name__}, not a quantised tensor")
        out = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        out.weight, out.bias = linear.weight, linear.bias
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FrozenWeightLinear.apply(x, self.weight, self.bias)


def wrap_frozen_quantized(model: torch.nn.Module, accept: Callable[[torch.nn.Module, str], bool]) -> int:
    """Replace every linear `accept` chose (the same filter the quantiser used). Returns how many."""
    chosen = [(fqn, m) for fqn, m in model.named_modules() if type(m) is torch.nn.Linear and accept(m, fqn)]
    for fqn, module in chosen:
        parent_name, _, child = fqn.rpartition(".")
        setattr(model.get_submodule(parent_name), child, FrozenQuantizedLinear.wrapping(module))
    return len(chosen)
