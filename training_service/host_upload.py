"""How a host tensor reaches the device without making the host wait for the device's queue.

A copy from pageable host memory waits until the work queued before it on the stream has run, so a training
loop that uploads its next batch while the device still runs the step before stalls there: the host cannot get
ahead. Copied through page-locked memory the upload joins the queue instead and the call returns at once; the
page-locked buffer comes from torch's caching host allocator, which does not hand it out again before the copy
has run. Anywhere but a CUDA device, a plain copy.
"""
from __future__ import annotations

import torch


def upload(value: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`value` on `device` (cast to `dtype` there, if given), queued behind the device's work without waiting."""
    device = torch.device(device)
    if device.type == "cuda" and value.device.type == "cpu":
        value = value.pin_memory().to(device, non_blocking=True)
    else:
        value = value.to(device)
    return value if dtype is None else value.to(dtype)
