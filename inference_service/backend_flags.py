"""Process-wide torch backend flags: snapshotted before a load's speed layer, restored on unload.

Without this, a `max` load's TF32 leaked into a later `off` load, which was then no longer
bit-identical.

A compiled load also traces sizes "size-obliviously" (torch's `backed_size_oblivious`) and gives every size
its own symbol (`use_duck_shape` off). Otherwise dynamo specialises a dimension that is 1 when traced, so the
warm-up's one image made the first request for several images trace the blocks again, holding the GPU worker
(8.9 s at bf16 and 15.5 s at fp8 for Z-Image on the H200); and the square warm-up tied height to width, so
the first non-square image traced the VAE decoder again. tests/inference_service/test_modes.py checks that
neither traces again.
"""
from __future__ import annotations

from dataclasses import dataclass

from inference_service import inductor_fixes


@dataclass(frozen=True)
class BackendFlags:
    cudnn_benchmark: bool
    cuda_matmul_tf32: bool
    cudnn_tf32: bool
    float32_matmul_precision: str
    size_oblivious: bool
    duck_shape: bool
    dynamo_stance: str = "default"  # "eager_on_recompile" once the compiler failed a generation (stop_tracing)


def snapshot() -> BackendFlags:
    import torch

    from torch.fx.experimental import _config as fx_config

    return BackendFlags(torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
                        torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision(),
                        fx_config.backed_size_oblivious, fx_config.use_duck_shape, _stance())


def restore(flags: BackendFlags) -> None:
    import torch

    torch.backends.cudnn.benchmark = flags.cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = flags.cuda_matmul_tf32
    torch.backends.cudnn.allow_tf32 = flags.cudnn_tf32
    torch.set_float32_matmul_precision(flags.float32_matmul_precision)
    from torch.fx.experimental import _config as fx_config

    fx_config.backed_size_oblivious = flags.size_oblivious
    fx_config.use_duck_shape = flags.duck_shape
    if _stance() != flags.dynamo_stance:
        torch.compiler.set_stance(flags.dynamo_stance)


def _stance() -> str:
    from torch._dynamo import eval_frame

    return eval_frame._stance.stance  # torch.compiler.set_stance has no getter


def apply_speed(cudnn_benchmark: bool, tf32: bool, compiled: bool = False) -> None:
    import torch
    from torch.fx.experimental import _config as fx_config

    if compiled:
        fx_config.backed_size_oblivious = True
        fx_config.use_duck_shape = False
        inductor_fixes.fix_open_slice_ends()  # torch 2.11's lowering fails FLUX's slices under these flags
    if cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    if tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
