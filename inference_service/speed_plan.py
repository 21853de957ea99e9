"""What each speed mode switches on, for this model and host."""
from __future__ import annotations

from dataclasses import dataclass

from diffusion.v1 import common_pb2 as c
from diffusion_kit.precision import Precision
from diffusion_kit.quant_probe import int8_dynamic
from diffusion_kit.resolved import Resolved, Source, Status
from inference_service.memory_plan import MODES as MEMORY_MODES


@dataclass(frozen=True)
class SpeedPlan:
    mode: str  # off | default | max
    compile: bool
    compile_options: dict  # inductor options for this compile alone; empty for another backend
    cudnn_benchmark: bool
    tf32: bool
    fuse_qkv: bool
    inference_mode: bool
    resolved: tuple[Resolved, ...]


# Their offload hooks move modules between devices on every call, so a compiled graph cannot hold them.
OFFLOAD_HOOK_MODES = ("low_vram", "sequential")


def asks_for_compile(speed_mode: int, memory_mode: int) -> bool:
    """Whether a request asks for a compiled transformer, read before its memory mode is planned."""
    return (speed_mode in (c.SPEED_MODE_DEFAULT, c.SPEED_MODE_MAX)
            and MEMORY_MODES.get(memory_mode) not in OFFLOAD_HOOK_MODES)


def compile_options(mode: str, *, compile_backend: str, int8_dynamic: bool) -> dict:
    """Inductor options passed to this compile alone (torch.compile's `options`), never set process-wide.

    max is torch's "max-autotune-no-cudagraphs" written out, so it can be combined with the others. A
    dynamic-int8 transformer gets the int32-matmul-with-rescale fusion torchao recommends for it (and would
    otherwise set process-wide, with coordinate-descent tuning). Measured on an H200 it changed nothing:
    Z-Image int8-default 93.5 ms/step with it, 90.8 without (docs/bench/inference.md).
    """
    if compile_backend != "inductor":
        return {}
    options = {"max_autotune": True, "coordinate_descent_tuning": True} if mode == "max" else {}
    if int8_dynamic:
        options["force_fuse_int_mm_with_mul"] = True
    return options


# The families whose VAE is diffusers' AutoencoderKL with the FLUX.1 decoder, where a compiled decoder was
# measured on an H200 (docs/bench/inference.md): a 1024x1024 decode 89 -> 37 ms, 48 dB from eager, but its
# dynamic-shape compile added about 70 s to a Z-Image fp8 load (10 -> 80 s). So it is part of speed mode MAX,
# whose loads already spend a minute or more compiling, and of DEFAULT only where the service keeps graphs
# compiled ahead of time (--aot-blocks): there only the first process pays the compile, and later ones load the
# decoder's graph. Qwen-Image's video VAE decodes frame by frame through a Python-side cache, and SDXL's upcasts
# to fp32 on some calls: neither was measured.
VAE_COMPILE_FAMILIES = ("zimage", "flux1")
VAE_COMPILE_LOAD_COST = "a compile of the decoder at every load"


def vae_decoder_compile(family: str, compiled: bool, mode: str, ahead_of_time: bool = False) -> Resolved:
    """Whether the VAE decoder is compiled (channels-last) along with the denoiser, in speed mode `mode`;
    `ahead_of_time`: the service keeps compiled graphs across processes (--aot-blocks)."""
    if not compiled:
        return Resolved("vae_decoder_compile", "", "off", Source.AUTO,
                        reason="the denoiser is not compiled, so neither is the decoder")
    if family not in VAE_COMPILE_FAMILIES:
        return Resolved("vae_decoder_compile", "", "off", Source.AUTO, Status.UNSUPPORTED,
                        f"a compiled decoder is measured for {', '.join(VAE_COMPILE_FAMILIES)} only")
    if ahead_of_time:
        return Resolved("vae_decoder_compile", "", "on", Source.AUTO,
                        reason="channels-last, compiled ahead of time (dynamic shapes): the first process compiles "
                               "and saves the decoder's graph, later ones load it")
    if mode != "max":
        return Resolved("vae_decoder_compile", "", "off", Source.AUTO,
                        reason="the decoder is compiled where its compile is paid once: in speed mode MAX, or "
                               "when the service keeps compiled graphs across processes (its default; this one "
                               "runs with --no-aot-blocks)")
    return Resolved("vae_decoder_compile", "", "on", Source.AUTO,
                    reason="channels-last, torch.compile(dynamic=True) of the decoder's forward; compiled at load")


def plan_speed(requested: int, *, device_kind: str, transformer_quant: Precision | None, memory_mode: str,
               compile_backend: str) -> SpeedPlan:
    asked = c.SpeedMode.Name(requested)
    if requested in (c.SPEED_MODE_UNSPECIFIED, c.SPEED_MODE_OFF):
        source = Source.EXPLICIT if requested == c.SPEED_MODE_OFF else Source.DEFAULT
        return SpeedPlan("off", False, {}, False, False, False, False, (
            Resolved("speed_mode", asked, "SPEED_MODE_OFF", source, reason="eager: the same seed gives identical bytes"),))
    mode = "max" if requested == c.SPEED_MODE_MAX else "default"
    records = [Resolved("speed_mode", asked, asked, Source.EXPLICIT)]
    compile_ok, why_not = True, ""
    if transformer_quant == Precision.NF4:
        compile_ok, why_not = False, "bitsandbytes 4-bit layers are not compiled"
    elif memory_mode in OFFLOAD_HOOK_MODES:
        compile_ok, why_not = False, f"{memory_mode} offload hooks move modules between devices every call"
    options = compile_options(mode, compile_backend=compile_backend,
                              int8_dynamic=transformer_quant == Precision.INT8 and int8_dynamic(device_kind, compile_ok))
    records.append(Resolved("compile", "on", f"regional ({compile_backend}{', ' if options else ''}"
                                             f"{', '.join(sorted(options))})" if compile_ok else "off", Source.AUTO,
                            Status.APPLIED if compile_ok else Status.FELL_BACK,
                            "compile_repeated_blocks(dynamic=True)" if compile_ok else why_not))
    cuda = device_kind == "cuda"
    records.append(Resolved("cudnn_benchmark", "on", "on" if cuda else "off", Source.AUTO,
                            Status.APPLIED if cuda else Status.UNSUPPORTED, "" if cuda else "no cuDNN on this host"))
    tf32 = fuse = False
    if mode == "max":
        tf32 = cuda
        records.append(Resolved("tf32", "on", "on" if tf32 else "off", Source.AUTO,
                                Status.APPLIED if tf32 else Status.UNSUPPORTED, "" if tf32 else "TF32 is CUDA-only"))
        fuse = transformer_quant is None and memory_mode == "resident"
        why_unfused = ("QKV fusion needs dense weights" if transformer_quant is not None else
                       f"{memory_mode} moves each layer's weights onto the device as it runs, the fused q, k and v "
                       "projection's and the separate ones' alike: fusion is for a resident model")
        records.append(Resolved("fused_qkv", "on", "on" if fuse else "off", Source.AUTO,
                                Status.APPLIED if fuse else Status.FELL_BACK, "" if fuse else why_unfused))
    return SpeedPlan(mode, compile_ok, options if compile_ok else {}, cuda, tf32, fuse, True, tuple(records))
