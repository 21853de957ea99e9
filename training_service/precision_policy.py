"""Which base precisions a LoRA training run can use on this host, and what AUTO picks.

One source of truth for both StartTraining's preflight and GetTrainingInfo, so a mode the start
would reject is never advertised. Pure functions of HostCaps and the family registry.
"""
from __future__ import annotations

from dataclasses import dataclass

from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.precision import Precision, names
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.units import format_bytes
from service_kit.errors import FailedPrecondition, InvalidArgument

GiB = 2**30
P = Precision
# The GPU modes, in the order GetTrainingInfo lists them (fp32 and fp16 are the CPU / U-Net dtypes).
MODES = (P.NF4, P.BF16, P.INT8, P.FP8, P.MXFP8)
ACCEPTED = (P.UNSPECIFIED, P.AUTO, P.FP32, *MODES)
# Activation memory of one LoRA step, batch 1, no checkpointing, and the resolution it was measured at:
# the bf16 eager step peak minus the bf16 weights, on an H200 through the service (docs/bench/training.md,
# 2026-12-02): Z-Image 31.4 - 11.5 GiB at 768 px, FLUX 30.5 - 22.2 GiB at 512 px. Qwen-Image and SDXL
# are scaled estimates, not measurements.
ACTIVATIONS = {"zimage": (int(19.9 * GiB), 768), "flux1": (int(8.3 * GiB), 512),
               "qwen_image": (int(20 * GiB), 768), "sdxl": (int(6 * GiB), 1024)}
# Base bytes per parameter during a step (Precision's training_bytes) were fitted so that weights +
# activations cover the measured step peaks of both families (nf4: FLUX 17.7 GiB; int8: Z-Image 25.7,
# FLUX 21.1; fp8: Z-Image 34.3, FLUX 33.2). Bases quantised on the GPU (loads_as_bf16) peak at the bf16
# weights while loading.
# Checkpointed blocks keep only their inputs. A conservative estimate of what is left, not a measurement.
CHECKPOINTED_ACTIVATIONS = 0.25
HEADROOM = 1.2
# What a lease must cover beyond the step's estimated tensors: the trainer process's CUDA context (with
# cuBLAS and cuDNN workspaces; about 0.7 GiB per process on an H200) and the caching allocator's blocks
# kept between a step's peaks (its reserved bytes exceed the allocated peak). Checked against NVML on an
# H200 in docs/bench/lease_usage.jsonl.
CONTEXT_BYTES = 1 * GiB
ALLOCATOR_MARGIN = 1.1


@dataclass(frozen=True)
class StepShape:
    """What a step's activations scale with. resolution None: the resolution the activations were measured at."""
    resolution: int | None = None
    batch: int = 1
    checkpointing: bool = False
    checkpoint_interval: int = 1  # with checkpointing, one block call in every this many is checkpointed

    @property
    def activation_share(self) -> float:
        """What is kept of the activations of a step without checkpointing: the checkpointed block calls (one in
        every interval) keep CHECKPOINTED_ACTIVATIONS of theirs, the others all of theirs."""
        if not self.checkpointing:
            return 1.0
        return 1.0 - (1.0 - CHECKPOINTED_ACTIVATIONS) / self.checkpoint_interval


def training_bytes(family: FamilySpec, precision: Precision, denoiser_params: int | None = None,
                   shape: StepShape = StepShape()) -> int:
    """Estimated peak of a training job: the larger of the load and a step (frozen base + activations).

    Activations grow with the image tokens (resolution squared) and the batch. With the actual model's
    parameter count they also shrink with it, so a tiny test model needs little.
    """
    nominal = family.denoiser_bytes / 2
    params = nominal if denoiser_params is None else denoiser_params
    activations, measured_at = ACTIVATIONS[family.key]
    tokens = ((shape.resolution or measured_at) / measured_at) ** 2 * max(1, shape.batch)
    activations *= min(1.0, params / nominal) * tokens * shape.activation_share
    step = params * precision.facts.training_bytes + activations
    load = params * 2 if precision.facts.loads_as_bf16 else 0
    return int(max(step, load))


def check_fits(caps: HostCaps, family: FamilySpec, precision: Precision, denoiser_params: int | None,
               shape: StepShape) -> int:
    """The job's estimated peak; FAILED_PRECONDITION before any lease when it exceeds the whole GPU."""
    need = training_bytes(family, precision, denoiser_params, shape)
    if caps.device_kind == "cuda" and need > caps.total_bytes:
        ideas = memory_relief(shape, nf4=precision == P.NF4)
        raise FailedPrecondition(
            f"{family.display} at {precision.proto_name} needs about {format_bytes(need)} at this resolution and batch; "
            f"{caps.device_name} has {format_bytes(caps.total_bytes)} in all. Try {', or '.join(ideas)}",
            reason="NEVER_FITS", metadata={"estimated_bytes": str(need), "total_bytes": str(caps.total_bytes)})
    return need


def lease_bytes(need: int, caps: HostCaps) -> int:
    """What a job asks the broker for: its estimated peak, plus the context and allocator margin on a GPU."""
    if caps.device_kind != "cuda":
        return need
    return int(need * ALLOCATOR_MARGIN) + CONTEXT_BYTES


def memory_relief(shape: StepShape, *, nf4: bool) -> list[str]:
    """What lowers a job's peak, cheapest first, leaving out what the job already does.

    Said before a job that can never fit starts, and by a trainer that ran out of memory.
    """
    ideas = []
    if not shape.checkpointing:
        ideas.append("gradient_checkpointing=true")
    elif shape.checkpoint_interval > 1:
        ideas.append("gradient_checkpointing_interval 1 (every block checkpointed)")
    if shape.batch > 1:
        ideas.append(f"batch_size {shape.batch // 2} with twice the gradient_accumulation_steps (the same effective batch)")
    if not nf4:
        ideas.append("base_precision PRECISION_NF4")
    if shape.resolution is None or shape.resolution > 512:  # below 512 px these bases learn little
        ideas.append(f"a resolution below {shape.resolution}" if shape.resolution else "a lower resolution")
    return ideas


def why_not(precision: Precision, caps: HostCaps, family: FamilySpec) -> str | None:
    """The rule an explicit mode fails on this host, or None. Each probe answers for itself."""
    if family.is_unet:
        return None  # SDXL ignores base_precision
    if caps.device_kind != "cuda":
        return f"{precision.proto_name} needs a CUDA GPU; this host has {caps.device_name}, where training runs in fp32 only"
    if not caps.native_bf16:
        return f"the DiT trainer needs native bf16 (compute capability 8.0+); {caps.device_name} only emulates it"
    if precision in family.denied_precisions:
        return f"{precision.proto_name} is not allowed for {family.display}: activation outliers exceed its range"
    facts = precision.facts
    if facts.library == "bitsandbytes" and not caps.bitsandbytes:
        return f"{precision.proto_name} needs bitsandbytes: {caps.bitsandbytes_reason}"
    if facts.library == "torchao" and not caps.torchao:
        return f"{precision.proto_name} needs a functional torchao: {caps.torchao_reason}"
    if facts.needs == "fp8" and not caps.fp8_capable:
        return f"{precision.proto_name} needs compute capability 8.9+; {caps.device_name} has {caps.capability}"
    if facts.needs == "blackwell" and not caps.blackwell:
        return (f"{precision.proto_name} needs a Blackwell GPU (compute capability 10.0+); {caps.device_name} has "
                f"{caps.capability}")
    return None


def advertised(caps: HostCaps, family: FamilySpec) -> list[Precision]:
    """What StartTraining accepts for this family here, AUTO included when it has something to pick."""
    if family.is_unet:
        return []
    if caps.device_kind != "cuda":
        return [P.FP32]
    modes = [m for m in MODES if why_not(m, caps, family) is None]
    return ([P.AUTO] + modes) if any(m in modes for m in (P.BF16, P.INT8, P.NF4)) else modes


@dataclass(frozen=True)
class AutoPick:
    precision: Precision
    reason: str


def auto_pick(caps: HostCaps, family: FamilySpec, free_bytes: int, prequantized: bool = False,
              shape: StepShape = StepShape(), denoiser_params: int | None = None) -> AutoPick:
    """bf16 when it fits with headroom, int8 in the middle band when torchao works, else nf4. Never fp8/mxfp8:
    fp8 trained slower than compiled bf16 at LoRA shapes (FLUX on an H200: docs/bench/training.md)."""
    if prequantized:
        return AutoPick(P.NF4, "the base is already 4-bit (bitsandbytes): nf4")
    free = free_bytes / GiB
    for precision in (P.BF16, P.INT8):
        need = training_bytes(family, precision, denoiser_params, shape) * HEADROOM
        if why_not(precision, caps, family) is None and need <= free_bytes:
            return AutoPick(precision, f"{precision.proto_name}: about {need / GiB:.1f} GiB with headroom, {free:.1f} GiB free")
    bf16, int8 = (training_bytes(family, p, denoiser_params, shape) * HEADROOM / GiB
                  for p in (P.BF16, P.INT8))
    return AutoPick(P.NF4, f"nf4: bf16 needs about {bf16:.1f} GiB and int8 {int8:.1f} GiB with headroom; "
                                     f"{free:.1f} GiB free")


def resolve(requested: Precision, caps: HostCaps, family: FamilySpec, free_bytes: int, prequantized: bool = False,
            shape: StepShape = StepShape(), denoiser_params: int | None = None) -> tuple[Precision, Resolved]:
    """The base precision a run will use, and its record. Raises INVALID_ARGUMENT / FAILED_PRECONDITION before
    any eviction."""
    control, asked = "base_precision", requested.proto_name
    if requested not in ACCEPTED:
        raise InvalidArgument(f"base_precision takes AUTO, {names(MODES)}, not {asked}",
                              reason="BAD_BASE_PRECISION")
    if family.is_unet:
        dtype = P.BF16 if caps.native_bf16 else (P.FP16 if caps.accelerator else P.FP32)
        return dtype, Resolved(control, asked, dtype.proto_name, Source.AUTO,
                               Status.UNSUPPORTED if requested != P.UNSPECIFIED else Status.APPLIED,
                               f"{family.display} trains its U-Net in the host's native dtype; base_precision is ignored")
    if caps.device_kind != "cuda":
        if requested == P.UNSPECIFIED:  # the documented default, NF4, needs CUDA: say it fell back
            return P.FP32, Resolved(control, asked, P.FP32.proto_name, Source.DEFAULT, Status.FELL_BACK,
                                    f"the default PRECISION_NF4 needs a CUDA GPU; no CUDA GPU here ({caps.device_name}): "
                                    "fp32 only")
        if requested in (P.AUTO, P.FP32):
            return P.FP32, Resolved(control, asked, P.FP32.proto_name,
                                    Source.AUTO if requested != P.FP32 else Source.EXPLICIT,
                                    reason=f"no CUDA GPU ({caps.device_name}): fp32 only")
        raise FailedPrecondition(why_not(requested, caps, family), reason="PRECISION_UNAVAILABLE")
    if requested == P.FP32:
        raise InvalidArgument(f"PRECISION_FP32 is the CPU fallback; on a GPU choose AUTO, {names(MODES)}",
                              reason="BAD_BASE_PRECISION")
    if prequantized and requested not in (P.UNSPECIFIED, P.AUTO, P.NF4):
        raise InvalidArgument(f"the base is already 4-bit: only NF4 trains on it. For {asked} use the dense base "
                              f"{family.default_repo}", reason="PREQUANTIZED_BASE")
    if requested == P.UNSPECIFIED:
        requested, source = P.NF4, Source.DEFAULT
    elif requested == P.AUTO:
        pick = auto_pick(caps, family, free_bytes, prequantized, shape, denoiser_params)
        reason = why_not(pick.precision, caps, family)
        if reason:
            raise FailedPrecondition(f"AUTO picked {pick.precision.proto_name}, which cannot run here: {reason}",
                                     reason="PRECISION_UNAVAILABLE")
        return pick.precision, Resolved(control, asked, pick.precision.proto_name, Source.AUTO, reason=pick.reason)
    else:
        source = Source.EXPLICIT
    reason = why_not(requested, caps, family)
    if reason:
        raise FailedPrecondition(reason, reason="PRECISION_UNAVAILABLE")
    return requested, Resolved(control, asked, requested.proto_name, source,
                               reason="the memory floor (QLoRA)" if requested == P.NF4 else "")
