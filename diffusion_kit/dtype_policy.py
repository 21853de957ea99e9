"""Which dense compute dtype a model runs in on this host."""
from __future__ import annotations

from diffusion.v1 import common_pb2 as c
from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import FailedPrecondition, InvalidArgument

NAMES = {c.PRECISION_BF16: "bf16", c.PRECISION_FP16: "fp16", c.PRECISION_FP32: "fp32"}
CONTROL = "compute_precision"


def _name(value: int) -> str:
    return c.Precision.Name(value)


def resolve_compute_dtype(requested: int, caps: HostCaps, family: FamilySpec) -> tuple[str, Resolved]:
    """Returns "bf16", "fp16" or "fp32" and the record. Raises for a dtype this host cannot honour."""
    asked = _name(requested)
    if requested in (c.PRECISION_UNSPECIFIED, c.PRECISION_AUTO):
        source = Source.AUTO
        if not caps.accelerator:
            return "fp32", Resolved(CONTROL, asked, "PRECISION_FP32", source,
                                    reason="CPU: fp32 (bf16 and fp16 matmuls are emulated and slow on the CPU)")
        if caps.native_bf16:
            return "bf16", Resolved(CONTROL, asked, "PRECISION_BF16", source, reason=f"native bf16 on {caps.device_name}")
        if family.fp16_incompatible or caps.device_kind == "mps":
            why = (f"{family.display} renders black images in fp16" if family.fp16_incompatible
                   else "MPS: fp16 is never used (black images)")
            return "fp32", Resolved(CONTROL, asked, "PRECISION_FP32", source, reason=f"no native bf16; {why}")
        return "fp16", Resolved(CONTROL, asked, "PRECISION_FP16", source, reason=f"no native bf16 on {caps.device_name}")
    if requested not in NAMES:
        raise InvalidArgument(f"compute_precision takes AUTO, BF16, FP16 or FP32, not {asked}; "
                              "quantisation schemes go in transformer_precision", reason="BAD_COMPUTE_PRECISION")
    if requested == c.PRECISION_BF16:
        if caps.accelerator and not caps.native_bf16:
            raise FailedPrecondition(f"PRECISION_BF16 needs native bf16 (NVIDIA compute capability 8.0+); "
                                     f"{caps.device_name} only emulates it. Use AUTO or FP16",
                                     reason="NO_NATIVE_BF16")
        return "bf16", Resolved(CONTROL, asked, asked, Source.EXPLICIT)
    if requested == c.PRECISION_FP16:
        if family.fp16_incompatible:
            return "fp32", Resolved(CONTROL, asked, "PRECISION_FP32", Source.EXPLICIT, Status.FELL_BACK,
                                    f"{family.display} renders black images in fp16: promoted to fp32")
        if caps.device_kind in ("mps", "cpu"):
            return "fp32", Resolved(CONTROL, asked, "PRECISION_FP32", Source.EXPLICIT, Status.FELL_BACK,
                                    f"fp16 is not used on {caps.device_kind} (black images on MPS, emulated on CPU)")
        return "fp16", Resolved(CONTROL, asked, asked, Source.EXPLICIT)
    return "fp32", Resolved(CONTROL, asked, asked, Source.EXPLICIT)
