"""What a loaded model can take: sizes and prompt lengths within its positional range, read from its config.

A request beyond them would fail inside the model (an IndexError into a rotary table); it is
refused with INVALID_ARGUMENT instead, and the limits are published in the loaded model's record.
Pure: the builder passes the denoiser's config and the pipeline's scale factors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

MAX_SIDE = 4096  # the service's own cap on width and height, whatever the model could take
# Z-Image pads a caption to a multiple of this many tokens and places the image's frame after it.
ZIMAGE_SEQ_MULTIPLE = 32


@dataclass(frozen=True)
class ModelLimits:
    size_multiple: int
    max_width: int
    max_height: int
    max_prompt_tokens: int = 0  # 0: no positional limit (the pipeline truncates long prompts itself)
    count_prompt_tokens: Callable[[str], int] | None = None  # how the model counts a prompt, when it has a limit
    # The pixels one pipeline call may hold: the image room its lease was planned for (image_room; set at load).
    max_pixels_per_call: int = 1024 * 1024


def model_limits(family_key: str, denoiser_config: dict, vae_scale_factor: int, max_sequence_length: int = 512,
                 count_prompt_tokens: Callable[[str], int] | None = None) -> ModelLimits:
    """The limits of one family's denoiser; `max_sequence_length` is what its pipeline truncates prompts to."""
    patch = _patch_size(denoiser_config)
    multiple = vae_scale_factor * 2
    if family_key == "sdxl":  # its pipeline refuses any side that is not a multiple of 8
        multiple = math.lcm(multiple, 8)
    if family_key == "zimage" and denoiser_config.get("axes_lens"):
        text_axis, h_axis, w_axis = denoiser_config["axes_lens"][:3]  # positions (caption/frame, height, width)
        side = vae_scale_factor * patch
        # Caption positions 0..padded-1 on the first axis, then the image frame at padded + 1.
        tokens = (text_axis - 2) // ZIMAGE_SEQ_MULTIPLE * ZIMAGE_SEQ_MULTIPLE
        return ModelLimits(multiple, max_width=_cap(w_axis * side, multiple),
                           max_height=_cap(h_axis * side, multiple),
                           max_prompt_tokens=tokens if tokens < max_sequence_length else 0,
                           count_prompt_tokens=count_prompt_tokens if tokens < max_sequence_length else None)
    return ModelLimits(multiple, _cap(MAX_SIDE, multiple), _cap(MAX_SIDE, multiple))


def _patch_size(config: dict) -> int:
    value = config.get("all_patch_size") or config.get("patch_size") or 1
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _cap(side: int, multiple: int) -> int:
    """The largest multiple of `multiple` no larger than the model's side or the service's cap."""
    return min(side, MAX_SIDE) // multiple * multiple
