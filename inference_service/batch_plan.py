"""How many of a request's images one pipeline call generates: as many as fit the image room its model's lease
was planned for (inference_service.image_room: the family's default image unless the Load asked for more).

Four 1024x1024 images in one call allocated 5.7 GiB more than one (H200, docs/bench/inference.md), so a batch
of them ran past a lease planned for one; images are therefore batched up to the room's pixels per call. At
1024x1024 batching gained 6-7% (the step is compute-bound), and an image generated alone is bit-identical to
a request of that one seed; smaller images still batch. An image larger than the room never gets here: the
Generate is refused first (image_room.check).

With several calls, progress counts the steps of all of them, and the generation's denoise time spans them
all (the decodes between calls included; its decode time is the last call's).
"""
from __future__ import annotations

from diffusion_kit.resolved import Resolved, Source, Status

CONTROL = "images_per_call"


def images_per_call(count: int, width: int, height: int, room: int) -> int:
    """Images of `width` x `height` one pipeline call may generate, of a request for `count`, in `room` pixels."""
    return max(1, min(count, room // (width * height)))


def record(count: int, width: int, height: int, room: int) -> Resolved | None:
    """What the generation's record says; None for a request that runs as one call."""
    per_call = images_per_call(count, width, height, room)
    if per_call >= count:
        return None
    calls = -(-count // per_call)
    return Resolved(CONTROL, str(count), str(per_call), Source.AUTO, Status.APPLIED,
                    f"{count} images of {width}x{height} run as {calls} calls of up to {per_call}: the model's lease "
                    f"has room for {room} pixels per call (its max_pixels_per_call)")
