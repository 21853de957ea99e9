"""Which quantisation the transformer and the text encoder get on this host, decided before any eviction."""
from __future__ import annotations

from dataclasses import dataclass

from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.precision import QUANTIZED, Precision, names
from diffusion_kit.quant_probe import default_fast_accum
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import FailedPrecondition, InvalidArgument

# What AUTO tries, best first: fp8 rides the fp8 tensor cores (1340+ TFLOP/s vs 790 bf16 on an H200);
# int8 is the Ampere-class fallback. The Blackwell microscaling formats stay explicit opt-ins.
AUTO_ORDER = (Precision.FP8, Precision.INT8)
# Without compile torchao's quantised matmuls lose to dense: on an H200, FLUX weight-only int8 with speed
# mode off took 230 ms per step against 170 dense (dynamic-activation int8 took 1176; quant_probe.int8_dynamic
# says why; docs/bench/inference.md), and torchao's own fp8 figures without compile are slower than dense too
# (pytorch/ao#685).
UNCOMPILED = ("the transformer will run uncompiled (speed_mode OFF, or an offloading memory_mode), where torchao's "
              "quantised matmuls are slower than dense (measured: docs/bench/inference.md), and int8 runs "
              "weight-only")


# Text encoders take weight-only schemes, best effort.
TEXT_ENCODER_SCHEMES = (Precision.FP8, Precision.NVFP4)


@dataclass(frozen=True)
class QuantChoice:
    transformer: Precision | None  # None = dense
    text_encoder: Precision | None
    fp8_fast_accum: bool
    resolved: tuple[Resolved, ...]


def resolve_quant(transformer_req: Precision, text_encoder_req: Precision, fast_accum_req: bool | None,
                  caps: HostCaps, family: FamilySpec, *, compiled: bool) -> QuantChoice:
    """compiled: whether the request asks for a compiled transformer (AUTO quantises only then)."""
    transformer, t_res = _transformer(transformer_req, caps, family, compiled)
    text_encoder, te_res = _text_encoder(text_encoder_req, caps)
    records = [t_res, te_res]
    fast = False
    if transformer == Precision.FP8:
        if fast_accum_req is None:
            fast = default_fast_accum(caps.device_name)
            records.append(Resolved("fp8_fast_accumulate", "auto", "on" if fast else "off", Source.AUTO,
                                    reason="consumer GPU: fp32 accumulate runs at half rate" if fast
                                    else "data-center GPU: accurate accumulate costs little"))
        else:
            fast = fast_accum_req
            records.append(Resolved("fp8_fast_accumulate", str(fast_accum_req).lower(), "on" if fast else "off",
                                    Source.EXPLICIT))
    return QuantChoice(transformer, text_encoder, fast, tuple(records))


def _transformer(requested: Precision, caps: HostCaps, family: FamilySpec,
                 compiled: bool) -> tuple[Precision | None, Resolved]:
    control, asked = "transformer_precision", requested.proto_name
    if requested == Precision.UNSPECIFIED:
        return None, Resolved(control, asked, "dense", Source.DEFAULT, reason="dense at the compute dtype")
    if requested == Precision.AUTO:
        if caps.device_kind != "cuda":
            return None, Resolved(control, asked, "dense", Source.AUTO, Status.FELL_BACK,
                                  f"no CUDA device ({caps.device_name}): quantised kernels would only slow it down")
        if not compiled:
            return None, Resolved(control, asked, "dense", Source.AUTO,
                                  reason=f"{UNCOMPILED}; AUTO quantises under SPEED_MODE_DEFAULT or MAX")
        tried = []
        for scheme in AUTO_ORDER:
            if scheme in family.denied_precisions:
                tried.append(f"{scheme}: denied for {family.display}")
            elif scheme in caps.quant_schemes:
                return scheme, Resolved(control, asked, scheme.proto_name, Source.AUTO,
                                        reason=f"best scheme that passed the smoke probe on {caps.device_name}")
            else:
                tried.append(caps.quant_failures.get(scheme, f"{scheme}: not probed"))
        return None, Resolved(control, asked, "dense", Source.AUTO, Status.FELL_BACK, "; ".join(tried))
    if requested not in QUANTIZED:
        raise InvalidArgument(f"transformer_precision takes AUTO, {names(QUANTIZED)} (unset = dense), "
                              f"not {asked}; the dense dtype goes in compute_precision", reason="BAD_TRANSFORMER_PRECISION")
    if requested in family.denied_precisions:
        raise InvalidArgument(f"{asked} is not allowed for {family.display}: its activation outliers exceed the "
                              f"format's range and corrupt the image; use INT8 or AUTO", reason="FAMILY_DENIES_PRECISION")
    scheme = requested
    if scheme.facts.library == "bitsandbytes":
        if not caps.bitsandbytes:
            raise FailedPrecondition(f"{asked} cannot run here: {caps.bitsandbytes_reason}", reason="NF4_UNAVAILABLE")
        return scheme, Resolved(control, asked, asked, Source.EXPLICIT)
    if scheme not in caps.quant_schemes:
        why = caps.quant_failures.get(scheme) or f"{scheme} did not pass the smoke probe"
        raise FailedPrecondition(f"{asked} cannot run here: {why}", reason="PRECISION_UNAVAILABLE")
    if not compiled and caps.device_kind == "cuda":
        return scheme, Resolved(control, asked, asked, Source.EXPLICIT,
                                reason=f"{UNCOMPILED}; it saves memory, and SPEED_MODE_DEFAULT makes it fast")
    return scheme, Resolved(control, asked, asked, Source.EXPLICIT)


def _text_encoder(requested: Precision, caps: HostCaps) -> tuple[Precision | None, Resolved]:
    """Best effort by contract: a scheme the host lacks falls back, reported, instead of failing the load."""
    control, asked = "text_encoder_precision", requested.proto_name
    if requested == Precision.UNSPECIFIED:
        return None, Resolved(control, asked, "dense", Source.DEFAULT, reason="dense at the compute dtype")
    if requested not in TEXT_ENCODER_SCHEMES:
        raise InvalidArgument(f"text_encoder_precision takes {names(TEXT_ENCODER_SCHEMES)} (unset = dense), "
                              f"not {asked}", reason="BAD_TEXT_ENCODER_PRECISION")
    scheme = requested
    if scheme == Precision.NVFP4 and scheme not in caps.quant_schemes:
        why = caps.quant_failures.get(scheme, f"{scheme} unavailable")
        if caps.fp8_capable and caps.torchao:
            return Precision.FP8, Resolved(control, asked, Precision.FP8.proto_name, Source.EXPLICIT, Status.FELL_BACK,
                                   f"{why}; fp8 weight-only instead")
        return None, Resolved(control, asked, "dense", Source.EXPLICIT, Status.FELL_BACK, why)
    if scheme == Precision.FP8 and not (caps.fp8_capable and caps.torchao):
        why = caps.quant_failures.get(scheme) or caps.torchao_reason or f"{scheme} unavailable"
        return None, Resolved(control, asked, "dense", Source.EXPLICIT, Status.FELL_BACK, why)
    return scheme, Resolved(control, asked, asked, Source.EXPLICIT)
