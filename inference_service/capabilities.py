"""What GetCapabilities advertises: derived by running the same policies Load runs, so a mode Load
would reject is never offered."""
from __future__ import annotations

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from diffusion_kit.dtype_policy import resolve_compute_dtype
from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.precision import DENSE, QUANTIZED, Precision
from inference_service.memory_plan import MODES, plan_memory
from inference_service.quant_policy import resolve_quant
from service_kit.errors import ServiceError

COMPUTE = (Precision.AUTO, *DENSE)
TRANSFORMER = (Precision.AUTO, *QUANTIZED)


def family_capabilities(caps: HostCaps, family: FamilySpec) -> pb.FamilyCapabilities:
    out = pb.FamilyCapabilities(family=family.proto, default_steps=family.default_steps,
                                default_guidance_scale=family.default_guidance,
                                default_resolution=family.default_resolution,
                                dense_footprint_bytes=family.dense_bytes)
    for value in COMPUTE:
        try:
            _, record = resolve_compute_dtype(value, caps, family)
        except ServiceError as e:
            out.notes.append(f"{value.proto_name}: {e.message}")
            continue
        if record.fell_back():  # a request that would not get what it asked for is not advertised
            out.notes.append(f"{value.proto_name}: {record.reason}")
        else:
            out.compute_precisions.append(value.proto)
    for value in TRANSFORMER:
        try:
            choice = resolve_quant(value, Precision.UNSPECIFIED, None, caps, family, compiled=True)
        except ServiceError as e:
            out.notes.append(f"{value.proto_name}: {e.message}")
            continue
        if choice.resolved[0].fell_back():
            out.notes.append(f"{value.proto_name}: {choice.resolved[0].reason}")
        else:
            out.transformer_precisions.append(value.proto)
    dtype_bytes = 2 if caps.native_bf16 else 4
    footprint = family.dense_bytes * dtype_bytes // 2
    largest = max(family.denoiser_bytes, family.companions_bytes) * dtype_bytes // 2
    out.memory_modes.append(c.MEMORY_MODE_AUTO)
    for value in MODES:
        try:
            plan_memory(value, device_kind=caps.device_kind, free_bytes=caps.free_bytes, total_bytes=caps.total_bytes,
                        footprint_bytes=footprint, largest_component_bytes=largest)
            out.memory_modes.append(value)
        except ServiceError as e:
            out.notes.append(f"{c.MemoryMode.Name(value)}: {e.message}")
    out.speed_modes.extend([c.SPEED_MODE_OFF, c.SPEED_MODE_DEFAULT, c.SPEED_MODE_MAX])
    return out
