"""Which dense compute dtype a model runs in on this host."""
from __future__ import annotations

from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.precision import DENSE, Precision, names
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import FailedPrecondition, InvalidArgument

CONTROL = "compute_precision"
BF16, FP16, FP32 = Precision.BF16, Precision.FP16, Precision.FP32


def resolve_compute_dtype(requested: Precision, caps: HostCaps, family: FamilySpec) -> tuple[Precision, Resolved]:
    """Returns BF16, FP16 or FP32 and the record. Raises for a dtype this host cannot honour."""
    asked = requested.proto_name
    if requested in (Precision.UNSPECIFIED, Precision.AUTO):
        source = Source.AUTO
        if not caps.accelerator:
            return FP32, Resolved(CONTROL, asked, FP32.proto_name, source,
                                  reason="CPU: fp32 (bf16 and fp16 matmuls are emulated and slow on the CPU)")
        if caps.native_bf16:
            return BF16, Resolved(CONTROL, asked, BF16.proto_name, source, reason=f"native bf16 on {caps.device_name}")
        if family.fp16_incompatible or caps.device_kind == "mps":
            why = (f"{family.display} renders black images in fp16" if family.fp16_incompatible
                   else "MPS: fp16 is never used (black images)")
            return FP32, Resolved(CONTROL, asked, FP32.proto_name, source, reason=f"no native bf16; {why}")
        return FP16, Resolved(CONTROL, asked, FP16.proto_name, source, reason=f"no native bf16 on {caps.device_name}")
    if requested not in DENSE:
        raise InvalidArgument(f"compute_precision takes AUTO, {names(DENSE)}, not {asked}; "
                              "quantisation schemes go in transformer_precision", reason="BAD_COMPUTE_PRECISION")
    if requested == BF16:
        if caps.accelerator and not caps.native_bf16:
            raise FailedPrecondition(f"PRECISION_BF16 needs native bf16 (NVIDIA compute capability 8.0+); "
                                     f"{caps.device_name} only emulates it. Use AUTO or FP16",
                                     reason="NO_NATIVE_BF16")
        return BF16, Resolved(CONTROL, asked, asked, Source.EXPLICIT)
    if requested == FP16:
        if family.fp16_incompatible:
            return FP32, Resolved(CONTROL, asked, FP32.proto_name, Source.EXPLICIT, Status.FELL_BACK,
                                  f"{family.display} renders black images in fp16: promoted to fp32")
        if caps.device_kind in ("mps", "cpu"):
            return FP32, Resolved(CONTROL, asked, FP32.proto_name, Source.EXPLICIT, Status.FELL_BACK,
                                  f"fp16 is not used on {caps.device_kind} (black images on MPS, emulated on CPU)")
        return FP16, Resolved(CONTROL, asked, asked, Source.EXPLICIT)
    return FP32, Resolved(CONTROL, asked, asked, Source.EXPLICIT)
