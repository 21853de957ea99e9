"""Which base precisions a LoRA training run can use on this host, and what AUTO picks.

One source of truth for both StartTraining's preflight and GetTrainingInfo, so a mode the start
would reject is never advertised. Pure functions of HostCaps and the family registry.
"""
from __future__ import annotations

from dataclasses import dataclass

from diffusion.v1 import common_pb2 as c
from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import FailedPrecondition, InvalidArgument

GiB = 2**30
MODES = (c.PRECISION_NF4, c.PRECISION_BF16, c.PRECISION_INT8, c.PRECISION_FP8, c.PRECISION_MXFP8)
ACCEPTED = (c.PRECISION_UNSPECIFIED, c.PRECISION_AUTO, c.PRECISION_FP32, *MODES)
# Activation memory of one LoRA step at the family's default training resolution, batch 1, no
# checkpointing, measured on an H200 (DESIGN.md): peak minus bf16 weights. Z-Image 768 px: 31 - 12.3;
# FLUX 512 px: 31 - 23.8. Qwen-Image and SDXL are scaled estimates, not measurements.
ACTIVATION_BYTES = {"zimage": int(18.7 * GiB), "flux1": int(7.2 * GiB), "qwen_image": int(20 * GiB),
                    "sdxl": int(6 * GiB)}
BYTES_PER_PARAM = {c.PRECISION_FP32: 4.0, c.PRECISION_FP16: 2.0, c.PRECISION_BF16: 2.0, c.PRECISION_INT8: 1.06, c.PRECISION_NF4: 0.56,
                   c.PRECISION_FP8: 1.06, c.PRECISION_MXFP8: 1.06}
HEADROOM = 1.2


def name(value: int) -> str:
    return c.Precision.Name(value) if value in c.Precision.values() else f"precision {value}"


def training_bytes(family: FamilySpec, precision: int, denoiser_params: int | None = None) -> int:
    """Estimated peak of a training step: the frozen base at its precision plus the step's activations.

    With the actual model's parameter count, activations scale with it (a tiny test model needs little).
    """
    nominal = family.denoiser_bytes / 2
    params = nominal if denoiser_params is None else denoiser_params
    return int(params * BYTES_PER_PARAM[precision] + ACTIVATION_BYTES[family.key] * min(1.0, params / nominal))


def why_not(precision: int, caps: HostCaps, family: FamilySpec) -> str | None:
    """The rule an explicit mode fails on this host, or None. Each probe answers for itself."""
    if family.denoiser == "unet":
        return None  # SDXL ignores base_precision
    if caps.device_kind != "cuda":
        return f"{name(precision)} needs a CUDA GPU; this host has {caps.device_name}, where training runs in fp32 only"
    if not caps.native_bf16:
        return f"the DiT trainer needs native bf16 (compute capability 8.0+); {caps.device_name} only emulates it"
    if precision in family.denied_precisions:
        return f"{name(precision)} is not allowed for {family.display}: activation outliers exceed its range"
    if precision == c.PRECISION_NF4 and not caps.bitsandbytes:
        return f"PRECISION_NF4 needs bitsandbytes: {caps.bitsandbytes_reason}"
    if precision in (c.PRECISION_INT8, c.PRECISION_FP8, c.PRECISION_MXFP8) and not caps.torchao:
        return f"{name(precision)} needs a functional torchao: {caps.torchao_reason}"
    if precision == c.PRECISION_FP8 and not caps.fp8_capable:
        return f"PRECISION_FP8 needs compute capability 8.9+; {caps.device_name} has {caps.capability}"
    if precision == c.PRECISION_MXFP8 and not caps.blackwell:
        return f"PRECISION_MXFP8 needs a Blackwell GPU (compute capability 10.0+); {caps.device_name} has {caps.capability}"
    return None


def advertised(caps: HostCaps, family: FamilySpec) -> list[int]:
    """What StartTraining accepts for this family here, AUTO included when it has something to pick."""
    if family.denoiser == "unet":
        return []
    if caps.device_kind != "cuda":
        return [c.PRECISION_FP32]
    modes = [m for m in MODES if why_not(m, caps, family) is None]
    return ([c.PRECISION_AUTO] + modes) if any(m in modes for m in (c.PRECISION_BF16, c.PRECISION_INT8,
                                                                    c.PRECISION_NF4)) else modes


@dataclass(frozen=True)
class AutoPick:
    precision: int
    reason: str


def auto_pick(caps: HostCaps, family: FamilySpec, free_bytes: int, prequantized: bool = False) -> AutoPick:
    """bf16 when it fits with headroom, int8 in the middle band when torchao works, else nf4. Never fp8/mxfp8:
    the reference system measured fp8 training slower than compiled bf16 at LoRA shapes (FLUX 3.15 vs 4.12 steps/s)."""
    if prequantized:
        return AutoPick(c.PRECISION_NF4, "the base is already 4-bit (bitsandbytes): nf4")
    free = free_bytes / GiB
    for precision in (c.PRECISION_BF16, c.PRECISION_INT8):
        need = training_bytes(family, precision) * HEADROOM
        if why_not(precision, caps, family) is None and need <= free_bytes:
            return AutoPick(precision, f"{name(precision)}: about {need / GiB:.1f} GiB with headroom, {free:.1f} GiB free")
    return AutoPick(c.PRECISION_NF4, f"nf4: bf16 needs about {training_bytes(family, c.PRECISION_BF16) * HEADROOM / GiB:.1f}"
                                     f" GiB and int8 {training_bytes(family, c.PRECISION_INT8) * HEADROOM / GiB:.1f} GiB"
                                     f" with headroom; {free:.1f} GiB free")


def resolve(requested: int, caps: HostCaps, family: FamilySpec, free_bytes: int, prequantized: bool = False) -> Resolved:
    """The base precision a run will use. Raises INVALID_ARGUMENT / FAILED_PRECONDITION before any eviction."""
    control, asked = "base_precision", name(requested)
    if requested not in ACCEPTED:
        raise InvalidArgument(f"base_precision takes NF4, BF16, INT8, FP8, MXFP8 or AUTO, not {asked}",
                              reason="BAD_BASE_PRECISION")
    if family.denoiser == "unet":
        dtype = "PRECISION_BF16" if caps.native_bf16 else ("PRECISION_FP16" if caps.accelerator else "PRECISION_FP32")
        return Resolved(control, asked, dtype, Source.AUTO, Status.UNSUPPORTED if requested else Status.APPLIED,
                        f"{family.display} trains its U-Net in the host's native dtype; base_precision is ignored")
    if caps.device_kind != "cuda":
        if requested in (c.PRECISION_UNSPECIFIED, c.PRECISION_AUTO, c.PRECISION_FP32):
            return Resolved(control, asked, "PRECISION_FP32", Source.AUTO if requested != c.PRECISION_FP32 else
                            Source.EXPLICIT, reason=f"no CUDA GPU ({caps.device_name}): fp32 only")
        raise FailedPrecondition(why_not(requested, caps, family), reason="PRECISION_UNAVAILABLE")
    if requested == c.PRECISION_FP32:
        raise InvalidArgument("PRECISION_FP32 is the CPU fallback; on a GPU choose NF4, BF16, INT8, FP8 or AUTO",
                              reason="BAD_BASE_PRECISION")
    if prequantized and requested not in (c.PRECISION_UNSPECIFIED, c.PRECISION_AUTO, c.PRECISION_NF4):
        raise InvalidArgument(f"the base is already 4-bit: only NF4 trains on it. For {asked} use the dense base "
                              f"{family.default_repo}", reason="PREQUANTIZED_BASE")
    if requested == c.PRECISION_UNSPECIFIED:
        requested, source = c.PRECISION_NF4, Source.DEFAULT
    elif requested == c.PRECISION_AUTO:
        pick = auto_pick(caps, family, free_bytes, prequantized)
        reason = why_not(pick.precision, caps, family)
        if reason:
            raise FailedPrecondition(f"AUTO picked {name(pick.precision)}, which cannot run here: {reason}",
                                     reason="PRECISION_UNAVAILABLE")
        return Resolved(control, asked, name(pick.precision), Source.AUTO, reason=pick.reason)
    else:
        source = Source.EXPLICIT
    reason = why_not(requested, caps, family)
    if reason:
        raise FailedPrecondition(reason, reason="PRECISION_UNAVAILABLE")
    return Resolved(control, asked, name(requested), source,
                    reason="the memory floor (QLoRA)" if requested == c.PRECISION_NF4 else "")
