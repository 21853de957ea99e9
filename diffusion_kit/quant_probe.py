"""torchao quantisation schemes: their configs, the minimum-feature filter, and the smoke probe that gates them."""
from __future__ import annotations

from typing import Callable

from diffusion_kit.precision import BLACKWELL_ONLY, TORCHAO_SCHEMES, Precision

# Token-exact data-center names: HBM parts whose fp8 FP32-accumulate is not halved (A40 is data-center, A4000 is not).
_DATA_CENTER = {"H100", "H200", "H800", "H20", "B100", "B200", "B300", "GB200", "GB300", "A100", "A800", "A30", "A40",
                "A10", "A10G", "A16", "A2", "L4", "L20", "L40", "L40S", "V100", "T4", "P100", "GH200"}


def is_consumer_gpu(device_name: str) -> bool:
    """GeForce/TITAN and unknown names count as consumer; only a listed data-center token does not."""
    tokens = device_name.replace("-", " ").split()
    return not any(t in _DATA_CENTER for t in tokens)


def default_fast_accum(device_name: str) -> bool:
    """Consumer parts halve fp8 FP32-accumulate throughput, so they want fast accumulate; data-center parts
    lose little to the accurate path and keep it. Not measured here: no consumer GPU was available, and the
    H200 figures in docs/bench/inference.md ran with it off."""
    return is_consumer_gpu(device_name)


def min_feature_filter(min_features: int) -> Callable:
    """Quantise only Linear layers big enough to gain: tiny projections crash int8's _int_mm and gain nothing."""
    import torch

    def accept(module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and module.in_features >= min_features
                and module.out_features >= min_features and module.in_features % 16 == 0
                and module.out_features % 16 == 0 and "lora_" not in fqn)

    return accept


def contained(config):
    """The torchao config with its process-wide side effects switched off.

    torchao configs default to set_inductor_config=True, which on quantize_ turns on coordinate-descent
    tuning for every later compile in the process and, in torchao 0.17, set_float32_matmul_precision("high"),
    TF32 for all fp32 matmuls, never restored. Run by the start-up smoke probe, that made every compile of
    the service slower and its fp32 mode not fp32. How a compile is tuned is the speed mode's decision.
    """
    import dataclasses

    if dataclasses.is_dataclass(config) and any(f.name == "set_inductor_config" for f in dataclasses.fields(config)):
        return dataclasses.replace(config, set_inductor_config=False)
    return config


def int8_dynamic(device_kind: str, compiled: bool) -> bool:
    """Whether int8 quantises activations too (tensor-core int8 matmuls) or only the weights.

    Dynamic activations can only pay on a compiled CUDA transformer (on an H200 they did not: FLUX 169 ms
    per step against 127 for compiled bf16). Uncompiled, torchao's int8 matmul (torchao.kernel.intmm.safe_int_mm)
    formats its input with repr() on every call to test for a FakeTensor, which syncs the GPU: FLUX took 1176
    ms per step against 172 dense, and 230 weight-only. On the CPU the kernels gain nothing. Weight-only
    keeps the memory saving in every case.
    """
    return device_kind == "cuda" and compiled


def scheme_config(scheme: str, *, device_kind: str, compiled: bool, fast_accum: bool = False):
    """The torchao config for a scheme (config objects, not strings: diffusers' TorchAoConfig takes these too)."""
    if scheme == Precision.INT8:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

        dynamic = int8_dynamic(device_kind, compiled)
        return contained(Int8DynamicActivationInt8WeightConfig() if dynamic else Int8WeightOnlyConfig())
    if scheme == Precision.FP8:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Float8MMConfig, PerRow

        return contained(Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(),
                                                                   mm_config=Float8MMConfig(use_fast_accum=fast_accum)))
    if scheme == Precision.MXFP8:
        from torchao.prototype.mx_formats import MXFPInferenceConfig

        return contained(MXFPInferenceConfig())
    if scheme == Precision.NVFP4:
        from torchao.prototype.mx_formats import NVFP4InferenceConfig

        return contained(NVFP4InferenceConfig())
    raise ValueError(f"unknown scheme {scheme!r}")


def per_sample_config(scheme: str, *, device_kind: str, compiled: bool):
    """The config for the layers that see one row per sample, where it differs from scheme_config's.

    int8's dynamic-activation matmul (torch._int_mm) needs more than 16 rows and fails under compile on
    a batch-1 timestep or modulation projection; weight-only int8 keeps those layers' memory saving, and a
    one-row product is bound by reading the weight, which int8 halves either way. None: no difference.
    """
    if scheme == Precision.INT8 and int8_dynamic(device_kind, compiled):
        from torchao.quantization import Int8WeightOnlyConfig

        return contained(Int8WeightOnlyConfig())
    return None


def text_encoder_config(scheme: str):
    """Weight-only configs for the text encoder: best effort, memory first."""
    if scheme == Precision.FP8:
        from torchao.quantization import Float8WeightOnlyConfig

        return contained(Float8WeightOnlyConfig())
    return scheme_config(scheme, device_kind="cuda", compiled=False)


def why_not(scheme: str, caps) -> str | None:
    """The capability rule a scheme fails on this host, before any probe; None when it may be tried."""
    if not caps.torchao:
        return f"torchao is not usable: {caps.torchao_reason}"
    if scheme in BLACKWELL_ONLY and not caps.blackwell:
        return f"{scheme} needs a Blackwell GPU (compute capability 10.0+); this host has {_describe(caps)}"
    if scheme == Precision.FP8 and not caps.fp8_capable:
        return f"fp8 needs an NVIDIA GPU with compute capability 8.9+; this host has {_describe(caps)}"
    if scheme == Precision.INT8 and caps.device_kind not in ("cuda", "cpu"):
        return f"int8 runs on CUDA or the CPU, not {caps.device_kind}"
    return None


def _describe(caps) -> str:
    if caps.capability:
        return f"{caps.device_name} (compute capability {caps.capability[0]}.{caps.capability[1]})"
    return caps.device_name


def smoke_probe_schemes(caps) -> tuple[set[str], dict[str, str]]:
    """Quantises a small Linear with each allowed scheme and runs one matmul on the device; records what fails."""
    import torch
    from torchao.quantization import quantize_

    device = "cuda" if caps.device_kind == "cuda" else "cpu"
    ok, failures = set(), {}  # by the scheme's key ("fp8")
    for scheme in TORCHAO_SCHEMES:
        reason = why_not(scheme, caps)
        if reason:
            failures[scheme.value] = reason
            continue
        try:
            dtype = torch.bfloat16 if caps.native_bf16 else torch.float32
            lin = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False)).to(device, dtype)
            # The compiled variant: for int8 that is the dynamic-activation kernel, the demanding one.
            quantize_(lin, scheme_config(scheme, device_kind=caps.device_kind, compiled=True))
            with torch.inference_mode():
                out = lin(torch.randn(32, 256, device=device, dtype=dtype))
            if not torch.isfinite(out).all():
                raise RuntimeError("non-finite output")
            ok.add(scheme.value)
        except Exception as e:  # a scheme that fails its probe is reported, never used
            failures[scheme.value] = f"{scheme} smoke probe failed: {type(e).__name__}: {str(e)[:200]}"
    return ok, failures
