"""Where a pipeline's weights live: planned from measured free memory and the model's estimated footprint."""
from __future__ import annotations

from dataclasses import dataclass

from diffusion.v1 import common_pb2 as c
from diffusion_kit.resolved import Resolved, Source, Status
from inference_service import image_room
from service_kit.errors import FailedPrecondition, ResourceExhausted

GiB = 2**30
# Activations, workspace and the CUDA context on top of the weights (the Z-Image bf16 pipeline peaked at
# 27.2 GiB at 1024px with ~20.5 GiB of weights on an H200). NVML saw the service use 0.3 GiB more than a
# 3 GiB headroom leased; docs/bench/lease_usage.jsonl has usage against lease per mode. Activations are held
# in the compute dtype: an fp32 Z-Image used 10.9 GiB over its weights where bf16 used 6.2, so the fixed part
# scales with the compute dtype's width (HEADROOM_BYTES is for 16-bit compute).
HEADROOM_BYTES = 4 * GiB
HEADROOM_FRACTION = 0.15
# Tiled VAE decode is inexact, and on the H200 a 1024x1024 decode in the offload tiers measured 16 dB from the
# resident image: tile only images too large to decode whole (about 1448x1448 and up).
TILE_ABOVE_PIXELS = 2_100_000
# Group offload (one block per group, prefetched on a side stream) peaks at about this share of the largest
# component on the device, with the blocks whose copies are still in flight. Measured on an H200 at 1024px:
# FLUX.1-dev (22.2 GiB transformer) used 15.2 GiB, which a 0.3 share (11.6 GiB lease) did not cover;
# Z-Image (11.5 GiB) used 5.1.
GROUP_OFFLOAD_SHARE = 0.5

MODES = {c.MEMORY_MODE_RESIDENT: "resident", c.MEMORY_MODE_BALANCED: "balanced",
         c.MEMORY_MODE_LOW_VRAM: "low_vram", c.MEMORY_MODE_SEQUENTIAL: "sequential"}
PROTO = {v: k for k, v in MODES.items()}


@dataclass(frozen=True)
class MemoryPlan:
    mode: str  # resident | balanced | low_vram | sequential
    vae_slicing: bool
    vae_tiling: bool  # this tier may tile: images above TILE_ABOVE_PIXELS are decoded in tiles
    device_bytes: int  # what the plan keeps on the device at peak, for the broker lease
    resolved: tuple[Resolved, ...]


def need_for(mode: str, footprint: int, largest: int, compute_bits: float = 16,
             pixels: int = image_room.MEASURED_PIXELS) -> int:
    """Device bytes at peak for this tier: what it keeps on the device, plus activations and workspace for calls
    of `pixels` (inference_service.image_room)."""
    on_device = {"resident": footprint, "balanced": int(largest * GROUP_OFFLOAD_SHARE),
                 "low_vram": largest, "sequential": largest // 8}[mode]
    return (int(on_device * (1 + HEADROOM_FRACTION)) + int(HEADROOM_BYTES * compute_bits / 16)
            + image_room.extra_bytes(pixels, compute_bits))


def plan_memory(requested: int, *, device_kind: str, free_bytes: int, total_bytes: int,
                footprint_bytes: int, largest_component_bytes: int, compute_bits: float = 16,
                pixels: int = image_room.MEASURED_PIXELS) -> MemoryPlan:
    """The tier for a model whose calls denoise and decode at most `pixels` pixels (its image room)."""
    asked = c.MemoryMode.Name(requested)
    footprint, largest = footprint_bytes, largest_component_bytes

    if device_kind == "cpu":
        if requested in (c.MEMORY_MODE_LOW_VRAM, c.MEMORY_MODE_SEQUENTIAL):
            raise FailedPrecondition(f"{asked} offloads to the CPU from an accelerator, and this host has none; "
                                     "use AUTO, RESIDENT or BALANCED", reason="OFFLOAD_NEEDS_ACCELERATOR")
        mode = "balanced" if requested == c.MEMORY_MODE_BALANCED else "resident"
        source = Source.EXPLICIT if requested in MODES else Source.AUTO
        why = "CPU host: the weights are already in host memory" if source is Source.AUTO else ""
        return _plan(mode, asked, source, Status.APPLIED, why, footprint, largest, compute_bits, pixels)

    if requested in MODES:
        mode = MODES[requested]
        need = need_for(mode, footprint, largest, compute_bits, pixels)
        if need > total_bytes:
            raise ResourceExhausted(
                f"{asked} needs about {need / GiB:.1f} GiB on the device and it has {total_bytes / GiB:.1f} GiB in all; "
                f"use AUTO or a lower memory mode", reason="DOES_NOT_FIT")
        return _plan(mode, asked, Source.EXPLICIT, Status.APPLIED, "", footprint, largest, compute_bits, pixels)

    for mode in ("resident", "balanced", "low_vram", "sequential"):
        need = need_for(mode, footprint, largest, compute_bits, pixels)
        if need <= free_bytes:
            why = (f"{mode}: needs about {need / GiB:.1f} GiB, {free_bytes / GiB:.1f} GiB free "
                   f"(weights {footprint / GiB:.1f} GiB, largest component {largest / GiB:.1f} GiB)")
            return _plan(mode, asked, Source.AUTO, Status.APPLIED, why, footprint, largest, compute_bits, pixels)
    least = need_for("sequential", footprint, largest, compute_bits, pixels)
    raise ResourceExhausted(f"does not fit even with sequential offload: about {least / GiB:.1f} GiB needed, "
                            f"{free_bytes / GiB:.1f} GiB free", reason="DOES_NOT_FIT")


def _plan(mode: str, asked: str, source: Source, status: Status, why: str, footprint: int, largest: int,
          compute_bits: float, pixels: int) -> MemoryPlan:
    # Slicing is exact (bit-identical) and saves memory whenever offloading; tiling is not exact above
    # 1 MP, so only the memory-starved tiers get it.
    slicing = mode != "resident"
    tiling = mode in ("low_vram", "sequential")
    resolved = (
        Resolved("memory_mode", asked, c.MemoryMode.Name(PROTO[mode]), source, status, why),
        Resolved("vae_slicing", "auto", "on" if slicing else "off", Source.AUTO,
                 reason="on whenever offloading" if slicing else "resident: not needed"),
        Resolved("vae_tiling", "auto", f"above {TILE_ABOVE_PIXELS / 1e6:.1f} MP" if tiling else "off", Source.AUTO,
                 reason="memory-starved tier: large images decode in tiles" if tiling
                 else "kept exact: only low_vram and sequential tile"),
    )
    return MemoryPlan(mode, slicing, tiling, need_for(mode, footprint, largest, compute_bits, pixels), resolved)
