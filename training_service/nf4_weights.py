"""nf4 frozen base weights the compiler can trace: torchao's NF4Tensor, in place of bitsandbytes' Linear4bit.

bitsandbytes' 4-bit matmul is a custom op the compiler cannot look into: it splits each compiled block graph at
every base linear, so an nf4 step runs many small graphs and launches, and its speed follows the host's (on two
starts of one H100 the same code trained nf4 Z-Image at 3.53 and 1.83 steps/s). NF4Tensor holds the same format
(4-bit NormalFloat codes in blocks of 64, their scales quantised again in blocks of 256) as a tensor subclass
whose dequantise is ordinary tensor code, which the compiler can trace into a block's graph. Its linear saves no
weight for the backward (the base is frozen; the backward dequantises again).

A linear is quantised here only where NF4Tensor's blocks tile its weight exactly, and never in the modules the
model keeps in fp32 (its `_keep_in_fp32_modules`, which diffusers' bitsandbytes loading leaves out too; not its
`_skip_layerwise_casting_patterns`, whose "norm" would keep FLUX.1's modulation linears, a quarter of its weights,
dense); the others keep the base dtype, and the counts are reported. The
weights are quantised one layer at a time on the device, so the dense base never sits there whole. Importing
this module does not import torch (the service's flags name the backends).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from diffusion_kit.resolved import Resolved, Source

if TYPE_CHECKING:
    import torch

BLOCK = 64  # weights per 4-bit block (one scale each)
SCALER_BLOCK = 256  # scales per block of the second quantisation

BACKENDS = ("bitsandbytes", "torchao")
DEFAULT_BACKEND = "bitsandbytes"
APPLIED = {"bitsandbytes": "bitsandbytes Linear4bit", "torchao": "torchao NF4Tensor"}


def record(backend: str) -> Resolved:
    """What holds an nf4 job's base weights, for the job's record: the service's --nf4-backend."""
    if backend == DEFAULT_BACKEND:
        return Resolved("nf4_weights", "", APPLIED[backend], Source.DEFAULT,
                        reason="the service's default --nf4-backend: a matmul the compiler does not trace")
    return Resolved("nf4_weights", backend, APPLIED[backend], Source.EXPLICIT,
                    reason="the service's --nf4-backend: a dequantise the compiler traces into the block graphs")


def _to_nf4() -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        from torchao.quantization import to_nf4  # torchao 0.18 and later
    except ImportError:
        from torchao.dtypes.nf4tensor import to_nf4  # torchao 0.17
    return to_nf4


def tiles(weight: torch.Tensor) -> bool:
    """Whether NF4Tensor's blocks tile `weight` exactly (its element count a multiple of 64 x 256)."""
    return weight.numel() % (BLOCK * SCALER_BLOCK) == 0


def kept_in_fp32(model: torch.nn.Module) -> tuple[str, ...]:
    """The name patterns of the modules `model` keeps in fp32."""
    return tuple(getattr(model, "_keep_in_fp32_modules", None) or ())


def quantize_frozen_linears(model: torch.nn.Module, device: str | torch.device,
                            accept: Callable[[torch.nn.Module, str], bool]) -> tuple[int, int]:
    """Every frozen linear `accept` takes, outside the modules the model keeps in fp32, whose weight NF4Tensor
    tiles gets an nf4 weight on `device`, one layer at a time; returns (quantised, kept dense) among the rest."""
    import torch

    to_nf4 = _to_nf4()
    kept = kept_in_fp32(model)
    quantised = dense = 0
    for name, module in model.named_modules():
        if not accept(module, name) or any(pattern in name for pattern in kept):
            continue
        weight = module.weight
        if weight.requires_grad:
            raise ValueError(f"{name} is trainable: only a frozen base linear is held in nf4")
        if not tiles(weight):
            dense += 1
            continue
        packed = to_nf4(weight.detach().to(device=device, dtype=torch.bfloat16), BLOCK, SCALER_BLOCK)
        module.weight = torch.nn.Parameter(packed, requires_grad=False)
        quantised += 1
    return quantised, dense
