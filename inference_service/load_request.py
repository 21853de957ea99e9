"""A LoadRequest checked and turned into a load plan: every preflight, before any GPU is asked for."""
from __future__ import annotations

import re
from dataclasses import dataclass

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from diffusion_kit.dtype_policy import resolve_compute_dtype
from diffusion_kit.families import BY_PROTO
from diffusion_kit.host_caps import HostCaps
from inference_service.memory_plan import plan_memory
from inference_service.model_source import SourceFiles
from inference_service.pipeline_builder import LoadPlan
from inference_service.quant_policy import resolve_quant
from inference_service.speed_plan import OFFLOAD_HOOK_MODES, asks_for_compile, plan_speed
from service_kit.errors import InvalidArgument, ResourceExhausted

MODEL_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")  # fullmatch: '$' alone let "m\n" through
# Bits per weight a quantised denoiser keeps, for the footprint estimate (scales and skipped layers included).
QUANT_BITS = {"int8": 8.5, "fp8": 8.5, "mxfp8": 8.5, "nvfp4": 4.5, "nf4": 4.5}


@dataclass(frozen=True)
class EngineSettings:
    quant_min_features: int = 1024
    compile_backend: str = "inductor"
    warmup_resolution: int = 1024
    lora_max_rank: int = 64  # the compiled model's hotswap slot holds adapters up to this rank


def check_request(req: pb.LoadRequest) -> None:
    """What can be checked without touching the disk."""
    if not MODEL_ID.fullmatch(req.model_id):
        raise InvalidArgument("model_id is required: 1-128 letters, digits, '.', '_' or '-'", reason="BAD_MODEL_ID")
    if req.family and req.family not in BY_PROTO:
        raise InvalidArgument(f"unknown family {req.family}", reason="UNKNOWN_ENUM_VALUE")
    for name in ("compute_precision", "transformer_precision", "text_encoder_precision"):
        if getattr(req, name) not in c.Precision.values():
            raise InvalidArgument(f"unknown {name} {getattr(req, name)}", reason="UNKNOWN_ENUM_VALUE")
    if req.HasField("device_index") and req.device_index < 0:
        raise InvalidArgument("device_index must be >= 0", reason="BAD_DEVICE_INDEX")


def plan_load(req: pb.LoadRequest, source: SourceFiles, caps: HostCaps, settings: EngineSettings) -> LoadPlan:
    family = source.family
    dtype, dtype_record = resolve_compute_dtype(req.compute_precision, caps, family)
    fast = req.fp8_fast_accumulate if req.HasField("fp8_fast_accumulate") else None
    device = {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "mps": "mps"}.get(caps.device_kind, "cpu")

    def sized(compiled: bool):
        quant = resolve_quant(req.transformer_precision, req.text_encoder_precision, fast, caps, family,
                              compiled=compiled)
        quant_bits = 4.5 if source.kind == "gguf" else QUANT_BITS.get(quant.transformer or "")  # GGUF: typical Q4
        footprint, largest = source.footprint_bytes(dtype, quant_bits)
        memory = plan_memory(req.memory_mode, device_kind=caps.device_kind, free_bytes=caps.free_bytes,
                             total_bytes=caps.total_bytes, footprint_bytes=footprint, largest_component_bytes=largest)
        return quant, footprint, memory

    compiled = asks_for_compile(req.speed_mode, req.memory_mode)
    quant, footprint, memory = sized(compiled)
    if compiled and memory.mode in OFFLOAD_HOOK_MODES:
        # Memory AUTO chose a tier whose hooks cannot be compiled: quantisation is decided again for the
        # uncompiled transformer it will be (AUTO stays dense, an explicit scheme says it runs uncompiled).
        # A dense footprint needs the same tier or a deeper one, so the transformer stays uncompiled; where
        # nothing dense fits, the quantised plan stands (its speed record says compile fell back).
        try:
            quant, footprint, memory = sized(False)
        except ResourceExhausted:
            pass
    speed = plan_speed(req.speed_mode, device_kind=caps.device_kind, transformer_quant=quant.transformer,
                       memory_mode=memory.mode, compile_backend=settings.compile_backend)
    resolved = [dtype_record, *quant.resolved, *memory.resolved, *speed.resolved]
    return LoadPlan(model_id=req.model_id, family=family, source=source, dtype=dtype, quant=quant, memory=memory,
                    speed=speed, device=device, quant_min_features=settings.quant_min_features,
                    compile_backend=settings.compile_backend, warmup_resolution=settings.warmup_resolution,
                    resolved=resolved, footprint_bytes=footprint, lora_max_rank=settings.lora_max_rank)
