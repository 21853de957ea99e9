"""How much image a loaded model's lease has room for: the pixels one pipeline call may denoise and decode.

A Load plans its GPU lease for calls of at most `max_pixels_per_call` pixels (width x height, summed over the
images of one call): the family's default image unless the request says (FLUX.1, Z-Image and SDXL 1024x1024,
Qwen-Image 1328x1328). The lease's fixed headroom (memory_plan) was sized and measured on one 1024x1024 image;
activations grow with the pixels of a call, and on an H200 four 1024x1024 Z-Image bf16 images in one call
allocated 5.7 GiB more than one (1.9 GiB per extra Mi pixel, docs/bench/inference.md). So a room above 1 Mi
pixels adds 2 GiB per Mi pixel at 16-bit compute (scaled with the compute dtype's width, like the headroom).

A Generate whose single image is larger than the room is refused (FAILED_PRECONDITION, with the size to load
with) instead of running past the lease; a request's images run in calls that fit the room (batch_plan).
Pure: no torch here.
"""
from __future__ import annotations

import math

from diffusion_kit.families import FamilySpec
from diffusion_kit.resolved import Resolved, Source
from service_kit.errors import FailedPrecondition

CONTROL = "max_pixels_per_call"
MEASURED_PIXELS = 1024 * 1024  # memory_plan's fixed headroom covers one call of this many pixels
BYTES_PER_PIXEL = 2048  # activations per pixel above MEASURED_PIXELS, at 16-bit compute (2 GiB per Mi pixel)
MAX_PIXELS = 4096 * 4096  # the largest image the service takes (model_limits.MAX_SIDE squared)


def resolve(requested: int, family: FamilySpec, compute_bits: float = 16) -> tuple[int, Resolved]:
    """The room a Load plans for (0: the family's default image), and its record."""
    if requested:
        pixels, source, why = requested, Source.EXPLICIT, "as asked"
    else:
        side = family.default_resolution
        pixels, source, why = side * side, Source.DEFAULT, f"{family.display}'s default image, {side}x{side}"
    extra = extra_bytes(pixels, compute_bits)
    lease = (f"; the lease adds {extra / 2**30:.1f} GiB for activations ({BYTES_PER_PIXEL * compute_bits / 16 / 1024:g}"
             f" GiB per Mi pixel above {MEASURED_PIXELS // 2**20} Mi at {compute_bits:g}-bit compute)" if extra else "")
    return pixels, Resolved(CONTROL, str(requested) if requested else "unset", str(pixels), source,
                            reason=f"{why}: a larger image is refused, and a request's images run in calls of "
                                   f"at most this many pixels{lease}")


def extra_bytes(pixels: int, compute_bits: float = 16) -> int:
    """What a room of `pixels` adds to a lease over the measured one-image headroom."""
    return int(max(0, pixels - MEASURED_PIXELS) * BYTES_PER_PIXEL * compute_bits / 16)


def warmup_side(asked: int, room: int) -> int:
    """The compile warm-up's side: the service's --warmup-resolution, within what the lease covers (the room, and
    never less than the measured one-image headroom)."""
    return min(asked, math.isqrt(max(room, MEASURED_PIXELS)))


def check(width: int, height: int, room: int, model_id: str) -> None:
    """Refuses an image larger than the room its model was loaded with."""
    if width * height > room:
        raise FailedPrecondition(
            f"a {width}x{height} image is {width * height} pixels; model {model_id} was loaded with room for "
            f"{room} pixels per pipeline call (its GPU lease is sized for that; see its limits). Ask for a smaller "
            f"image, or load the model again with max_pixels_per_call of at least {width * height}",
            reason="IMAGE_LARGER_THAN_ROOM", metadata={"max_pixels_per_call": str(room)})
