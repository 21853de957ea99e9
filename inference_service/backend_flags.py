"""Process-wide torch backend flags: snapshotted before a load's speed layer, restored on unload.

Without this, a `max` load's TF32 leaked into a later `off` load, which was then no longer
bit-identical.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendFlags:
    cudnn_benchmark: bool
    cuda_matmul_tf32: bool
    cudnn_tf32: bool
    float32_matmul_precision: str


def snapshot() -> BackendFlags:
    import torch

    return BackendFlags(torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
                        torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())


def restore(flags: BackendFlags) -> None:
    import torch

    torch.backends.cudnn.benchmark = flags.cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = flags.cuda_matmul_tf32
    torch.backends.cudnn.allow_tf32 = flags.cudnn_tf32
    torch.set_float32_matmul_precision(flags.float32_matmul_precision)


def apply_speed(cudnn_benchmark: bool, tf32: bool) -> None:
    import torch

    if cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    if tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
