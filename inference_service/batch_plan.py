"""How many of a request's images one pipeline call generates: as many as fit the room its model's lease
planned for activations.

The lease (memory_plan.need_for) adds 15% of the weights and 4 GiB for activations, workspace and the CUDA
context, sized and measured on one 1024x1024 image: NVML saw a Z-Image bf16 generation use 0.97 of its lease
(docs/reliability.md), and four 1024x1024 images in one call allocated 5.7 GiB more than one (H200,
docs/bench/inference.md), so a batch of them ran past the lease. Images are therefore batched up to one
1024x1024 image's pixels per call. At that size batching gained 6-7% (the step is compute-bound), and an image
generated alone is bit-identical to a request of that one seed; smaller images still batch.

With several calls, progress counts the steps of all of them, and the generation's denoise time spans them
all (the decodes between calls included; its decode time is the last call's).
"""
from __future__ import annotations

from diffusion_kit.resolved import Resolved, Source, Status

PLANNED_PIXELS = 1024 * 1024
CONTROL = "images_per_call"


def images_per_call(count: int, width: int, height: int) -> int:
    """Images of `width` x `height` one pipeline call may generate, of a request for `count`."""
    return max(1, min(count, PLANNED_PIXELS // (width * height)))


def record(count: int, width: int, height: int) -> Resolved | None:
    """What the generation's record says; None for a request that runs as one call."""
    per_call = images_per_call(count, width, height)
    if per_call >= count:
        return None
    calls = -(-count // per_call)
    return Resolved(CONTROL, str(count), str(per_call), Source.AUTO, Status.APPLIED,
                    f"{count} images of {width}x{height} run as {calls} calls of up to {per_call}: the lease's room "
                    f"for activations is planned for {PLANNED_PIXELS // 2**20} Mi pixels per call")
