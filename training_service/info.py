"""What GetTrainingInfo says per family on this host: built from the same policy StartTraining runs."""
from __future__ import annotations

from diffusion.v1 import training_pb2 as pb
from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.precision import Precision
from training_service.precision_policy import (GiB, HEADROOM, MODES, StepShape, advertised, auto_pick,
                                               training_bytes, why_not)
from training_service.training_plan import DEFAULT_LR, DEFAULT_RANK, DEFAULT_RESOLUTION, DEFAULT_STEPS



def family_info(caps: HostCaps, family: FamilySpec) -> pb.FamilyTrainingInfo:
    modes = advertised(caps, family)
    if family.is_unet:
        recommended = Precision.UNSPECIFIED
    elif caps.device_kind != "cuda":
        recommended = Precision.FP32
    elif Precision.AUTO in modes:
        recommended = auto_pick(caps, family, caps.free_bytes).precision
    else:
        recommended = Precision.UNSPECIFIED
    return pb.FamilyTrainingInfo(
        family=family.proto, precision_modes=[m.proto for m in modes],
        recommended_precision=recommended.proto,
        supports_compile=caps.device_kind == "cuda" and caps.native_bf16,
        default_resolution=DEFAULT_RESOLUTION[family.key], default_rank=DEFAULT_RANK, default_alpha=DEFAULT_RANK,
        default_learning_rate=DEFAULT_LR, default_steps=DEFAULT_STEPS, memory_note=memory_note(caps, family))


def memory_note(caps: HostCaps, family: FamilySpec) -> str:
    if family.is_unet:
        dtype = Precision.BF16 if caps.native_bf16 else (Precision.FP16 if caps.accelerator else Precision.FP32)
        return f"{family.display} trains its U-Net in {dtype} on {caps.device_name}; base_precision is ignored"
    if caps.device_kind != "cuda":
        return f"no CUDA GPU ({caps.device_name}): trains in fp32 only, slowly"
    shape = StepShape(DEFAULT_RESOLUTION[family.key])
    parts = [f"{caps.free_bytes / GiB:.1f} GiB free on {caps.device_name}; estimates at "
             f"{shape.resolution} px, batch 1, with headroom (they grow with pixels and batch)"]
    for mode in MODES:
        reason = why_not(mode, caps, family)
        if reason:
            parts.append(f"{mode.proto_name} unavailable: {reason}")
        else:
            parts.append(f"{mode.proto_name} needs about {training_bytes(family, mode, shape=shape) * HEADROOM / GiB:.0f} GiB")
    return "; ".join(parts)


def training_info(caps: HostCaps, families) -> pb.GetTrainingInfoResponse:
    optimizers = [pb.OPTIMIZER_ADAMW] + ([pb.OPTIMIZER_ADAMW_8BIT] if caps.adamw8bit else [])
    return pb.GetTrainingInfoResponse(families=[family_info(caps, f) for f in families],
                                      cpu_only=caps.device_kind == "cpu", optimizers=optimizers,
                                      adamw_8bit_unavailable_reason="" if caps.adamw8bit else caps.adamw8bit_reason)
