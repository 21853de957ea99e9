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
from service_kit.units import format_bytes
from service_kit.errors import FailedPrecondition, InvalidArgument

GiB = 2**30
MODES = (c.PRECISION_NF4, c.PRECISION_BF16, c.PRECISION_INT8, c.PRECISION_FP8, c.PRECISION_MXFP8)
ACCEPTED = (c.PRECISION_UNSPECIFIED, c.PRECISION_AUTO, c.PRECISION_FP32, *MODES)
# Activation memory of one LoRA step, batch 1, no checkpointing, and the resolution it was measured at:
# the bf16 eager step peak minus the bf16 weights, on an H200 through the service (docs/bench/training.md,
# 2026-12-02): Z-Image 31.4 - 11.5 GiB at 768 px, FLUX 30.5 - 22.2 GiB at 512 px. Qwen-Image and SDXL
# are scaled estimates, not measurements.
ACTIVATIONS = {"zimage": (int(19.9 * GiB), 768), "flux1": (int(8.3 * GiB), 512),
               "qwen_image": (int(20 * GiB), 768), "sdxl": (int(6 * GiB), 1024)}
# Base bytes per parameter during a step, fitted so that weights + activations cover the measured step
# peaks of both families (nf4: FLUX 17.7 GiB; int8: Z-Image 25.7, FLUX 21.1; fp8: Z-Image 34.3, FLUX 33.2).
# fp8 keeps the bf16 weight and saves an fp8 copy for the backward pass, hence above bf16.
BYTES_PER_PARAM = {c.PRECISION_FP32: 4.0, c.PRECISION_FP16: 2.0, c.PRECISION_BF16: 2.0, c.PRECISION_INT8: 1.15,
                   c.PRECISION_NF4: 0.85, c.PRECISION_FP8: 2.5, c.PRECISION_MXFP8: 2.5}
# int8, fp8 and mxfp8 load the base in bf16 onto the GPU and quantise it there: the load peaks at the bf16 weights.
LOADED_AS_BF16 = (c.PRECISION_INT8, c.PRECISION_FP8, c.PRECISION_MXFP8)
# Checkpointed blocks keep only their inputs. A conservative estimate of what is left, not a measurement.
CHECKPOINTED_ACTIVATIONS = 0.25
HEADROOM = 1.2


@dataclass(frozen=True)
class StepShape:
    """What a step's activations scale with. resolution None: the resolution the activations were measured at."""
    resolution: int | None = None
    batch: int = 1
    checkpointing: bool = False


def name(value: int) -> str:
    return c.Precision.Name(value) if value in c.Precision.values() else f"precision {value}"


def value(applied: str) -> int:
    """The enum value of a resolved record's `applied` name."""
    return c.Precision.Value(applied)


def training_bytes(family: FamilySpec, precision: int, denoiser_params: int | None = None,
                   shape: StepShape = StepShape()) -> int:
    """Estimated peak of a training job: the larger of the load and a step (frozen base + activations).

    Activations grow with the image tokens (resolution squared) and the batch. With the actual model's
    parameter count they also shrink with it, so a tiny test model needs little.
    """
    nominal = family.denoiser_bytes / 2
    params = nominal if denoiser_params is None else denoiser_params
    activations, measured_at = ACTIVATIONS[family.key]
    tokens = ((shape.resolution or measured_at) / measured_at) ** 2 * max(1, shape.batch)
    activations *= min(1.0, params / nominal) * tokens * (CHECKPOINTED_ACTIVATIONS if shape.checkpointing else 1.0)
    step = params * BYTES_PER_PARAM[precision] + activations
    load = params * 2 if precision in LOADED_AS_BF16 else 0
    return int(max(step, load))


def check_fits(caps: HostCaps, family: FamilySpec, precision: int, denoiser_params: int | None,
               shape: StepShape) -> int:
    """The job's estimated peak; FAILED_PRECONDITION before any lease when it exceeds the whole GPU."""
    need = training_bytes(family, precision, denoiser_params, shape)
    if caps.device_kind == "cuda" and need > caps.total_bytes:
        ideas = memory_relief(shape, nf4=precision == c.PRECISION_NF4)
        raise FailedPrecondition(
            f"{family.display} at {name(precision)} needs about {format_bytes(need)} at this resolution and batch; "
            f"{caps.device_name} has {format_bytes(caps.total_bytes)} in all. Try {', or '.join(ideas)}",
            reason="NEVER_FITS", metadata={"estimated_bytes": str(need), "total_bytes": str(caps.total_bytes)})
    return need


def memory_relief(shape: StepShape, *, nf4: bool) -> list[str]:
    """What lowers a job's peak, cheapest first, leaving out what the job already does.

    Said before a job that can never fit starts, and by a trainer that ran out of memory.
    """
    ideas = []
    if not shape.checkpointing:
        ideas.append("gradient_checkpointing=true")
    if shape.batch > 1:
        ideas.append(f"batch_size {shape.batch // 2} with twice the gradient_accumulation_steps (the same effective batch)")
    if not nf4:
        ideas.append("base_precision PRECISION_NF4")
    if shape.resolution is None or shape.resolution > 512:  # below 512 px these bases learn little
        ideas.append(f"a resolution below {shape.resolution}" if shape.resolution else "a lower resolution")
    return ideas


def why_not(precision: int, caps: HostCaps, family: FamilySpec) -> str | None:
    """The rule an explicit mode fails on this host, or None. Each probe answers for itself."""
    if family.is_unet:
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
    if family.is_unet:
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


def auto_pick(caps: HostCaps, family: FamilySpec, free_bytes: int, prequantized: bool = False,
              shape: StepShape = StepShape(), denoiser_params: int | None = None) -> AutoPick:
    """bf16 when it fits with headroom, int8 in the middle band when torchao works, else nf4. Never fp8/mxfp8:
    fp8 trained slower than compiled bf16 at LoRA shapes (FLUX on an H200: docs/bench/training.md)."""
    if prequantized:
        return AutoPick(c.PRECISION_NF4, "the base is already 4-bit (bitsandbytes): nf4")
    free = free_bytes / GiB
    for precision in (c.PRECISION_BF16, c.PRECISION_INT8):
        need = training_bytes(family, precision, denoiser_params, shape) * HEADROOM
        if why_not(precision, caps, family) is None and need <= free_bytes:
            return AutoPick(precision, f"{name(precision)}: about {need / GiB:.1f} GiB with headroom, {free:.1f} GiB free")
    bf16, int8 = (training_bytes(family, p, denoiser_params, shape) * HEADROOM / GiB
                  for p in (c.PRECISION_BF16, c.PRECISION_INT8))
    return AutoPick(c.PRECISION_NF4, f"nf4: bf16 needs about {bf16:.1f} GiB and int8 {int8:.1f} GiB with headroom; "
                                     f"{free:.1f} GiB free")


def resolve(requested: int, caps: HostCaps, family: FamilySpec, free_bytes: int, prequantized: bool = False,
            shape: StepShape = StepShape(), denoiser_params: int | None = None) -> Resolved:
    """The base precision a run will use. Raises INVALID_ARGUMENT / FAILED_PRECONDITION before any eviction."""
    control, asked = "base_precision", name(requested)
    if requested not in ACCEPTED:
        raise InvalidArgument(f"base_precision takes NF4, BF16, INT8, FP8, MXFP8 or AUTO, not {asked}",
                              reason="BAD_BASE_PRECISION")
    if family.is_unet:
        dtype = "PRECISION_BF16" if caps.native_bf16 else ("PRECISION_FP16" if caps.accelerator else "PRECISION_FP32")
        return Resolved(control, asked, dtype, Source.AUTO, Status.UNSUPPORTED if requested else Status.APPLIED,
                        f"{family.display} trains its U-Net in the host's native dtype; base_precision is ignored")
    if caps.device_kind != "cuda":
        if requested == c.PRECISION_UNSPECIFIED:  # the documented default, NF4, needs CUDA: say it fell back
            return Resolved(control, asked, "PRECISION_FP32", Source.DEFAULT, Status.FELL_BACK,
                            f"the default PRECISION_NF4 needs a CUDA GPU; no CUDA GPU here ({caps.device_name}): "
                            "fp32 only")
        if requested in (c.PRECISION_AUTO, c.PRECISION_FP32):
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
        pick = auto_pick(caps, family, free_bytes, prequantized, shape, denoiser_params)
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
