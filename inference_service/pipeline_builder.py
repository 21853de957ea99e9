"""Builds a pipeline from a load plan: weights, quantisation, placement, speed layer, warm-up. Runs on the GPU worker.

Order matters and is deliberate: quantise before compiling (compile must see the quantised
modules), and place before compiling (offload hooks change what the graph calls).
"""
from __future__ import annotations

import copy
import gc
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from diffusion_kit.compile_errors import compile_failed, compiler_error, uncompile
from diffusion_kit.families import FamilySpec
from diffusion_kit.precision import Precision
from diffusion_kit.resolved import Resolved, Source, Status
from diffusion_kit import aot_blocks
from inference_service import backend_flags, qkv_fusion, step_graphs
from inference_service.load_plan import LoadPlan
from inference_service.model_limits import ModelLimits, model_limits
from inference_service.pinned_offload import PinnedOffload, unswappable
from inference_service.prompt_cache import PromptCache
from inference_service.speed_plan import VAE_COMPILE_LOAD_COST, vae_decoder_compile
from service_kit.errors import Cancelled, FailedPrecondition


@dataclass
class BuiltPipeline:
    pipe: object
    plan: LoadPlan
    flags_before: backend_flags.BackendFlags
    resolved: list[Resolved]
    compile_warmup_s: float | None = None
    limits: ModelLimits = field(default_factory=lambda: ModelLimits(16, 4096, 4096))
    prompt_cache: PromptCache | None = None  # repeated prompts skip the text encoders (engine-installed)
    offload: PinnedOffload | None = None  # the low_vram tier's model moves
    aot: aot_blocks.AotBlocks | None = None  # the blocks' graphs compiled ahead of time (--aot-blocks)
    aot_decoder: aot_blocks.AotBlocks | None = None  # the VAE decoder's, likewise
    graphs: step_graphs.StepGraphs | None = None  # the denoiser's calls replayed as CUDA graphs (step_graphs)

    def before_first_adapter(self) -> str:
        """A model's first adapter is about to add layers to its blocks: what was fused, captured or compiled for
        the blocks without them gives way. Returns what gave way, for the adapter's record."""
        gave_way = []
        if self._split_fused_qkv():
            gave_way.append("their fused q, k and v projections are split again")
        if self.graphs is not None:
            self.graphs.forget()
        if self.aot is not None and self.aot.installed:
            self.aot.uninstall()
            gave_way.append("their graphs compiled ahead of time hold no adapter")
        return "; ".join(gave_way)

    def _split_fused_qkv(self) -> bool:
        """An adapter's layers sit on the separate q, k and v projections, which fused attention (SPEED_MODE_MAX)
        no longer calls: left fused, the adapter would change the image without its attention layers. The model
        runs unfused from its first adapter on, and its record says so."""
        if not qkv_fusion.split(getattr(self.pipe, self.plan.family.denoiser)):
            return False
        self.resolved[:] = [r for r in self.resolved if r.control != "fused_qkv"] + [
            Resolved("fused_qkv", "on", "off", Source.AUTO, Status.FELL_BACK,
                     "an adapter's layers sit on the separate q, k and v projections: since this model's first "
                     "adapter they run unfused")]
        return True

    def take_aot_misses(self) -> list[tuple[aot_blocks.AotBlocks, int]]:
        """Each set of graphs compiled ahead of time with the calls none of them covered since the last take."""
        return [(aot, misses) for aot in (self.aot, self.aot_decoder) if aot is not None
                for misses in [aot.take_misses()] if misses]

    @property
    def size_multiple(self) -> int:
        return self.limits.size_multiple


def _check(abort: threading.Event | None, phase: str) -> None:
    if abort is not None and abort.is_set():
        raise Cancelled(f"load aborted during {phase}", reason="LOAD_ABORTED")


def build(plan: LoadPlan, on_phase: Callable[[str, str], None], abort: threading.Event | None = None) -> BuiltPipeline:
    import diffusers
    import torch

    dtype = getattr(torch, plan.dtype.facts.torch_dtype)
    if plan.device.startswith("cuda:"):
        torch.cuda.set_device(plan.device)  # this worker thread's current device: the one the lease is on
    # plain "cuda" (no broker, so no lease names a device): the process's current device, as torch would pick
    family, src = plan.family, plan.source
    flags_before = backend_flags.snapshot()
    resolved = list(plan.resolved)

    on_phase("building", f"{family.pipeline_class} from {src.describe} in {plan.dtype}")
    kwargs: dict = {"dtype": dtype, **({"variant": src.variant} if src.variant else {})}
    denoiser_cls = getattr(diffusers, family.denoiser_class)
    if src.denoiser_file is not None:
        single = {"config": str(src.pipeline_dir), "subfolder": family.denoiser, "dtype": dtype}
        if src.kind == "gguf":
            single["quantization_config"] = diffusers.GGUFQuantizationConfig(compute_dtype=dtype)
        kwargs[family.denoiser] = denoiser_cls.from_single_file(str(src.denoiser_file), **single)
    if plan.quant.transformer and plan.quant.transformer.facts.library == "bitsandbytes":
        kwargs["quantization_config"] = diffusers.PipelineQuantizationConfig(
            quant_backend="bitsandbytes_4bit",
            quant_kwargs={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": dtype},
            components_to_quantize=[family.denoiser])
    pipeline_cls = getattr(diffusers, family.pipeline_class)
    pipe = pipeline_cls.from_pretrained(str(src.pipeline_dir), **kwargs)
    pipe.set_progress_bar_config(disable=True)
    _check(abort, "building")

    resident = plan.memory.mode == "resident"
    if resident and plan.device != "cpu" and plan.quantize_on_device:
        pipe.to(plan.device)  # quantise on the device: seconds instead of minutes on the CPU
    if (plan.quant.transformer and plan.quant.transformer.facts.library == "torchao") or plan.quant.text_encoder:
        on_phase("quantizing", f"transformer {plan.quant.transformer or 'dense'}, text encoder "
                               f"{plan.quant.text_encoder or 'dense'}")
        resolved += _quantize(pipe, plan)
        _check(abort, "quantizing")

    offload, placed = _place(pipe, plan)
    resolved += placed
    if plan.memory.vae_slicing:
        pipe.vae.enable_slicing()

    limits = replace(_limits(pipe, family), max_pixels_per_call=plan.pixels_per_call)
    built = BuiltPipeline(pipe, plan, flags_before, resolved, limits=limits, offload=offload)
    speed = plan.speed
    backend_flags.apply_speed(speed.cudnn_benchmark, speed.tf32, compiled=speed.compile)
    if speed.fuse_qkv:
        if not qkv_fusion.fuse(getattr(pipe, family.denoiser)):
            resolved.append(Resolved("fused_qkv", "on", "off", Source.AUTO, Status.UNSUPPORTED,
                                     f"{family.denoiser_class} has no fused QKV projections"))
    if speed.compile:
        try:
            _compile(pipe, plan, built, on_phase, abort, resolved)
        except Exception as e:  # noqa: BLE001 - only the compiler's own failures are caught (compile_errors)
            if not compile_failed(e):
                raise
            _run_uncompiled(pipe, family, built, e, resolved)
    elif speed.mode != "off":
        resolved.append(vae_decoder_compile(family.key, False, speed.mode))
    return built


def _compile(pipe, plan: LoadPlan, built: BuiltPipeline, on_phase: Callable[[str, str], None],
             abort: threading.Event | None, resolved: list[Resolved]) -> None:
    """The speed layer's compile: the repeated blocks (ahead of time where asked, else regionally), the VAE decoder
    where the mode compiles it, and the warm-up that traces them."""
    family, speed = plan.family, plan.speed
    if hasattr(pipe, "enable_lora_hotswap"):  # must precede compile: adapters then swap without recompiling
        pipe.enable_lora_hotswap(target_rank=plan.lora_max_rank)
    denoiser = getattr(pipe, family.denoiser)

    def regional() -> None:
        denoiser.compile_repeated_blocks(fullgraph=True, dynamic=True, backend=plan.compile_backend,
                                         **({"options": speed.compile_options} if speed.compile_options else {}))

    if plan.aot_dir:
        built.aot = _ahead_of_time(pipe, plan, built, regional, on_phase, resolved)
    if built.aot is None:
        on_phase("compiling", f"regional compile of the repeated blocks ({plan.compile_backend})")
        regional()
    else:  # the graphs were traced on ordinary tensors: generations run under no_grad
        built.plan = plan = replace(plan, speed=replace(speed, inference_mode=False))
    # The decoder's graph joins the blocks' where they were compiled ahead of time; where they fell back (a backend
    # that cannot save, a remembered failure) it would too, after one more traced warm-up.
    vae_compile = vae_decoder_compile(family.key, True, speed.mode, ahead_of_time=built.aot is not None)
    if vae_compile.applied == "on":
        planned = list(resolved)
        _decode_one_at_a_time(pipe.vae, resolved)
        if built.aot is not None:  # generations already run under no_grad, as the decoder's graph is traced
            vae_compile = _decoder_ahead_of_time(pipe, plan, built, on_phase, vae_compile)
            if vae_compile.applied == "off":  # eager after all: the memory plan's slicing again
                if not plan.memory.vae_slicing:
                    pipe.vae.disable_slicing()
                resolved[:] = planned
        else:
            compile_decoder(pipe.vae, plan.compile_backend)
    resolved.append(vae_compile)
    _check(abort, "compiling")
    if plan.cuda_graphs:  # before the warm-up, whose second step captures: a capture that fails does so at load
        built.graphs = step_graphs.StepGraphs(denoiser)
        built.graphs.install()
    on_phase("warming", f"first call at {plan.warmup_resolution}px compiles the blocks"
                        f"{' and the VAE decoder' if vae_compile.applied == 'on' else ''}")
    t0 = time.perf_counter()
    traced = warm_up(pipe, family, built.size_multiple, plan.warmup_resolution,
                     decode=vae_compile.applied == "on", batches=WARM_UP_BATCHES,
                     inference_mode=plan.speed.inference_mode)
    built.compile_warmup_s = time.perf_counter() - t0
    if built.graphs is not None:
        built.graphs.take()  # the warm-up's calls are no generation's
        say_if_graphs_fell_back(built, resolved)
    decoder_misses = built.aot_decoder.take_misses() if built.aot_decoder is not None else 0
    if built.aot is not None:
        misses = built.aot.take_misses()
        why = (f"calls of one image and of two on the blocks' graphs compiled ahead of time ({traced[0]} and "
               f"{traced[1]} other graphs traced; {misses} block calls no graph covered"
               f"{f', {decoder_misses} decoder calls' if built.aot_decoder is not None else ''})")
    else:
        why = (f"calls of one image and of two ({traced[0]} and {traced[1]} graphs traced: some families' blocks "
               "tell one image from several); a warm compile cache spares the next process the inductor compile, "
               "not the tracing (measured: docs/bench/inference.md)")
    resolved.append(Resolved("compile_warmup", "", f"{built.compile_warmup_s:.1f}s", Source.AUTO, reason=why))


def say_if_graphs_fell_back(built: BuiltPipeline, resolved: list[Resolved]) -> None:
    """Once a capture has failed (at the warm-up or in a generation), the model's record says graphs are off and
    why, in place of the plan's."""
    if built.graphs is not None and built.graphs.failed is not None:
        resolved[:] = [r for r in resolved if r.control != step_graphs.CONTROL] + [
            step_graphs.record(step_graphs.Counts(), built.graphs.failed)]


def stop_tracing(built: BuiltPipeline, error: BaseException) -> None:
    """The compiler failed on a graph a generation needed (new inputs, a first adapter): from now on the model's
    compiled graphs run where their guards pass and every other call runs uncompiled (dynamo's
    eager_on_recompile stance), rather than each such call failing again; the model's record says so. The stance
    is process-wide, as the service holds one model; unload restores it (backend_flags)."""
    import logging

    import torch

    torch.compiler.set_stance("eager_on_recompile")
    why = compiler_error(error)
    logging.getLogger("inference_service.pipeline_builder").warning(
        "the compiler failed during a generation; new graphs are no longer traced", extra={"fields": {
            "event": "compile.stopped_tracing", "model_family": built.plan.family.key, "error": why}})
    built.resolved[:] = [r for r in built.resolved if r.control != "compile"] + [
        Resolved("compile", "on", "compiled graphs only", Source.AUTO, Status.FELL_BACK,
                 reason=f"the compiler failed on a graph a generation needed ({why}); calls the compiled graphs "
                        "do not cover run uncompiled from now on")]


def _run_uncompiled(pipe, family: FamilySpec, built: BuiltPipeline, error: BaseException,
                    resolved: list[Resolved]) -> None:
    """Undoes a compile that failed: the blocks and the decoder run their own forward again, the records of the
    compile give way to one that says it fell back and why, and generations run under inference_mode."""
    import logging

    for aot in (built.aot, built.aot_decoder):
        if aot is not None:
            aot.discard()
    built.aot = built.aot_decoder = None
    if built.graphs is not None:
        built.graphs.uninstall()
        built.graphs = None
    uncompile(getattr(pipe, family.denoiser))
    decoder = getattr(getattr(pipe, "vae", None), "decoder", None)
    if decoder is not None:
        decoder.__dict__.pop("forward", None)
    why = compiler_error(error)
    logging.getLogger("inference_service.pipeline_builder").warning(
        "the compile failed; the model runs uncompiled", extra={"fields": {
            "event": "compile.fell_back", "model_family": family.key, "error": why}})
    kept = [r for r in resolved if r.control not in ("compile", "compile_warmup", "vae_decoder_compile",
                                                      aot_blocks.CONTROL, step_graphs.CONTROL)]
    resolved[:] = kept + [Resolved("compile", "on", "off", Source.AUTO, Status.FELL_BACK,
                                   reason=f"the compiler failed on this model ({why}); it runs uncompiled"),
                          step_graphs.plan(enabled=True, device_kind="", compiled=False, memory_mode="")]
    built.plan = replace(built.plan, speed=replace(built.plan.speed, compile=False, compile_options={},
                                                   inference_mode=True), cuda_graphs=False)
    built.compile_warmup_s = None
    # One eager call, so that an error of the model itself (which the compiler may have met first) fails the load
    # here rather than the first generation.
    warm_up(pipe, family, built.size_multiple, built.plan.warmup_resolution)

# One image, then two: FLUX's and Qwen-Image's blocks trace a graph for one image and another for several (a
# guard on the batch size of their linear layers' input), so without the second call the first multi-image
# request traced on the GPU worker while other requests waited (8.9-15.5 s on the H200 for Z-Image, before its
# batch size was traced size-obliviously: inference_service.backend_flags).
WARM_UP_BATCHES = (1, 2)


def _limits(pipe, family: FamilySpec) -> ModelLimits:
    """The sizes and prompt lengths this pipeline's denoiser has positions for."""
    config = dict(getattr(pipe, family.denoiser).config)
    counter = None
    if family.key == "zimage":
        # A copy of its own: a fast tokenizer keeps its padding and truncation settings in its backend, and the
        # pipeline's call on the GPU worker (padding to 512) could otherwise set them under a count on the event
        # loop, which then counted 512 tokens for a short prompt (seen under concurrent load).
        tokenizer = copy.deepcopy(pipe.tokenizer)

        def counter(prompt: str) -> int:  # the pipeline's own chat template, as it encodes the prompt
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True, enable_thinking=True)
            return len(tokenizer(text, truncation=True, max_length=512)["input_ids"])
    return model_limits(family.key, config, pipe.vae_scale_factor, 512, counter)


def _quantize(pipe, plan: LoadPlan) -> list[Resolved]:
    import torch
    from torchao.quantization import quantize_

    from diffusion_kit.quant_probe import (int8_dynamic, min_feature_filter, per_sample_config, scheme_config,
                                           text_encoder_config)

    out = []
    accept = min_feature_filter(plan.quant_min_features)
    scheme, family = plan.quant.transformer, plan.family
    if scheme and scheme.facts.library == "torchao":
        denoiser = getattr(pipe, family.denoiser)
        linears = [(n, m) for n, m in denoiser.named_modules() if isinstance(m, torch.nn.Linear)]
        chosen = sum(1 for n, m in linears if accept(m, n))
        if chosen == 0:
            raise FailedPrecondition(
                f"no linear layer of this transformer has >= {plan.quant_min_features} features: {scheme} "
                "would change nothing", reason="NOTHING_TO_QUANTIZE")
        device_kind = "cuda" if plan.device.startswith("cuda") else "cpu"
        compiled = plan.speed.compile
        cfg = scheme_config(scheme, device_kind=device_kind, compiled=compiled, fast_accum=plan.quant.fp8_fast_accum)
        reason = f"linear layers with >= {plan.quant_min_features} features, dims divisible by 16"
        if scheme == Precision.INT8 and not int8_dynamic(device_kind, compiled):
            reason += ("; weight-only int8: dynamic-activation int8 gains only on a compiled CUDA transformer "
                       "(uncompiled, torchao syncs the GPU on every matmul)")
        per_sample_cfg = per_sample_config(scheme, device_kind=device_kind, compiled=compiled)
        if per_sample_cfg is None:
            quantize_(denoiser, cfg, filter_fn=accept)
        else:
            quantize_(denoiser, cfg, filter_fn=lambda m, n: accept(m, n) and not family.is_per_sample(n))
            quantize_(denoiser, per_sample_cfg, filter_fn=lambda m, n: accept(m, n) and family.is_per_sample(n))
            weight_only = sum(1 for n, m in linears if accept(m, n) and family.is_per_sample(n))
            reason += (f"; {weight_only} of them take one row per sample (timestep and modulation projections) "
                       f"and are weight-only {scheme}: its dynamic-activation matmul needs more than 16 rows")
        out.append(Resolved("transformer_quantized_layers", "", f"{chosen} of {len(linears)}", Source.AUTO,
                            reason=reason))
    if plan.quant.text_encoder:
        for name in ("text_encoder", "text_encoder_2"):
            encoder = getattr(pipe, name, None)
            if encoder is None:
                continue
            try:
                quantize_(encoder, text_encoder_config(plan.quant.text_encoder), filter_fn=accept)
                out.append(Resolved(f"{name}_precision", plan.quant.text_encoder, plan.quant.text_encoder, Source.EXPLICIT))
            except Exception as e:  # best effort by contract: reported, never silent
                out.append(Resolved(f"{name}_precision", plan.quant.text_encoder, "dense", Source.EXPLICIT,
                                    Status.FELL_BACK, f"quantising failed: {type(e).__name__}: {str(e)[:160]}"))
    return out


def _place(pipe, plan: LoadPlan) -> tuple[PinnedOffload | None, list[Resolved]]:
    """Puts the pipeline's weights where the memory plan says; the low_vram tier's offload (or None) and
    what placing resolved."""
    mode, device = plan.memory.mode, plan.device
    if mode == "low_vram":
        return _offload_models(pipe, device)
    if mode == "resident":
        pipe.to(device)
    elif mode == "balanced":
        stream = device.startswith("cuda")
        pipe.enable_group_offload(onload_device=device, offload_device="cpu", offload_type="block_level",
                                  num_blocks_per_group=1, use_stream=stream, **({"record_stream": True} if stream else {}))
    elif mode == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
    return None, []


def _offload_models(pipe, device: str) -> tuple[PinnedOffload | None, list[Resolved]]:
    """low_vram: whole models moved on when called, from page-locked host copies (inference_service.
    pinned_offload); accelerate's model offload, said in the record, when a model's tensors cannot be swapped."""
    import torch

    excluded = set(getattr(pipe, "_exclude_from_cpu_offload", ()))
    models = {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module) and name not in excluded}
    for name, model in models.items():
        why = unswappable(model)
        if why is not None:
            pipe.enable_model_cpu_offload(device=device)
            return None, [Resolved("model_offload", "pinned", "accelerate", Source.AUTO, Status.FELL_BACK,
                                   f"{name}: {why}, whose storage cannot be swapped between host and device copies; "
                                   f"accelerate's model offload copies every model both ways on every generation")]
    for name in excluded:
        if isinstance(pipe.components.get(name), torch.nn.Module):
            pipe.components[name].to(device)
    offload = PinnedOffload(models, device, pin=device.startswith("cuda"))
    offload.attach()
    return offload, [offload.record()]


def _ahead_of_time(pipe, plan: LoadPlan, built: BuiltPipeline, regional: Callable[[], None],
                   on_phase: Callable[[str, str], None], resolved: list[Resolved]) -> aot_blocks.AotBlocks | None:
    """The blocks' graphs from disk, or compiled ahead of time and saved; None (said in the record) where they
    cannot be, and the regular regional compile runs instead."""
    from pathlib import Path

    family = plan.family
    on_phase("compiling", "the repeated blocks' graphs compiled ahead of time: loading them, or compiling and saving")
    flags = backend_flags.snapshot()
    env = aot_blocks.environment(plan.device, {
        "backend": plan.compile_backend, "options": sorted((k, str(v)) for k, v in plan.speed.compile_options.items()),
        "speed": plan.speed.mode, "tf32": flags.cuda_matmul_tf32, "cudnn_benchmark": flags.cudnn_benchmark,
        "size_oblivious": flags.size_oblivious, "duck_shape": flags.duck_shape, "dtype": str(plan.dtype),
        # a quantised layer's settings live in its tensors' metadata, which the block's structure does not show
        "quant": str(plan.quant.transformer), "fp8_fast_accum": plan.quant.fp8_fast_accum,
        "quant_min_features": plan.quant_min_features})

    def capture() -> None:
        warm_up(pipe, family, built.size_multiple, plan.warmup_resolution, batches=WARM_UP_BATCHES,
                inference_mode=False)

    try:
        aot = aot_blocks.install(getattr(pipe, family.denoiser), Path(plan.aot_dir), env, capture,
                                 plan.compile_backend, plan.speed.compile_options, regional)
    except aot_blocks.AotUnavailable as e:
        resolved.append(aot_blocks.fell_back(e.why))
        return None
    resolved.append(aot.record())
    return aot


def _decoder_ahead_of_time(pipe, plan: LoadPlan, built: BuiltPipeline, on_phase: Callable[[str, str], None],
                           record: Resolved) -> Resolved:
    """The VAE decoder's graph from disk, or compiled ahead of time (channels-last, dynamic shapes) and saved.
    Where it cannot be: speed mode MAX compiles it the regular way; DEFAULT, which would not pay that compile on
    every load, leaves it eager. Either is said in the returned record."""
    from pathlib import Path

    import torch

    vae, family = pipe.vae, plan.family
    vae.to(memory_format=torch.channels_last)
    on_phase("compiling", "the VAE decoder's graph compiled ahead of time: loading it, or compiling and saving")
    flags = backend_flags.snapshot()
    env = aot_blocks.environment(plan.device, {
        "module": "vae_decoder", "backend": plan.compile_backend, "dtype": str(vae.dtype), "channels_last": True,
        "tf32": flags.cuda_matmul_tf32, "cudnn_benchmark": flags.cudnn_benchmark,
        "size_oblivious": flags.size_oblivious, "duck_shape": flags.duck_shape})

    def capture() -> None:  # the pipeline's own decode, one image at a time (_decode_one_at_a_time)
        warm_up(pipe, family, built.size_multiple, plan.warmup_resolution, decode=True, batches=WARM_UP_BATCHES,
                inference_mode=False)

    try:
        built.aot_decoder = aot_blocks.install_modules(
            [vae.decoder], Path(plan.aot_dir), env, capture, plan.compile_backend, {},
            fallback=lambda: compile_decoder(vae, plan.compile_backend), kind="VAE decoder")
    except aot_blocks.AotUnavailable as e:
        if plan.speed.mode == "max":
            compile_decoder(vae, plan.compile_backend)
            return Resolved("vae_decoder_compile", "", "on", Source.AUTO, Status.FELL_BACK,
                            reason=f"not compiled ahead of time ({e.why}); compiled in this process")
        vae.to(memory_format=torch.contiguous_format)
        return Resolved("vae_decoder_compile", "", "off", Source.AUTO, Status.FELL_BACK,
                        reason=f"not compiled ahead of time ({e.why}); it runs eagerly rather than pay "
                               f"{VAE_COMPILE_LOAD_COST} on every load")
    return Resolved("vae_decoder_compile", "", "on", Source.AUTO,
                    reason=f"{record.reason}: {built.aot_decoder.how()}")


def compile_decoder(vae, backend: str) -> None:
    """The decoder's forward compiled, its weights channels-last: the module's own call (and so the service's
    cancel hook on it) stays eager around the compiled graph. dynamic=True: one graph for every image size.
    Without the mode's autotuning options: the decoder's compile alone was measured (speed_plan)."""
    import torch

    vae.to(memory_format=torch.channels_last)
    vae.decoder.forward = torch.compile(vae.decoder.forward, dynamic=True, backend=backend)


def _decode_one_at_a_time(vae, resolved: list[Resolved]) -> None:
    """The compiled decoder decodes each image on its own (VAE slicing, exact): torch's convolution tells a
    batch of one from larger ones in its traced graph, so a batch would trace the decoder a second time."""
    vae.enable_slicing()
    for i, r in enumerate(resolved):
        if r.control == "vae_slicing" and r.applied != "on":
            resolved[i] = Resolved("vae_slicing", r.requested, "on", Source.AUTO,
                                   reason="the compiled decoder's graph is for one image: each image is decoded on its own")


def warm_up(pipe, fam: FamilySpec, multiple: int, resolution: int, decode: bool = False,
            batches: tuple[int, ...] = (1,), inference_mode: bool = True) -> list[int]:
    """The calls that compile the blocks: 2 steps of about `resolution`**2 pixels in all, one call per image
    count in `batches`;
    with `decode`, the VAE decoder too (the pipeline's own decode), else latent output. Returns the graphs each
    call traced: a count whose graph the first call's already covered traces none and costs one short call."""
    import torch
    from torch._dynamo.utils import counters

    kwargs = {"prompt": "warm-up", "num_inference_steps": 2, "output_type": "pt" if decode else "latent",
              fam.guidance_kwarg: fam.default_guidance}
    if fam.guidance_kwarg == "true_cfg_scale" and fam.default_guidance > 1:
        kwargs["negative_prompt"] = " "  # as a generation does (generation.parse_generate): the unconditional pass too
    traced = []
    for n in batches:
        # n images at 1/n of the area: the sizes are traced as symbols, and the call stays in one image's memory
        side = int(resolution / n ** 0.5)
        size = max(multiple, side // multiple * multiple)
        before = counters["stats"]["unique_graphs"]
        with torch.inference_mode() if inference_mode else torch.no_grad():
            pipe(**kwargs, height=size, width=size, num_images_per_prompt=n,
                 generator=[torch.Generator("cpu").manual_seed(i) for i in range(n)])
        traced.append(counters["stats"]["unique_graphs"] - before)
    return traced


def unload(built: BuiltPipeline) -> int:
    """Frees the pipeline and restores the backend flags; returns device bytes freed as measured."""
    import torch

    cuda = built.plan.device.startswith("cuda")
    before = torch.cuda.memory_allocated(built.plan.device) if cuda else 0
    pipe = built.pipe
    built.pipe = None
    if built.graphs is not None:
        built.graphs.uninstall()
        built.graphs = None
    if built.offload is not None:
        built.offload.close()
    if hasattr(pipe, "remove_all_hooks"):
        pipe.remove_all_hooks()
    del pipe
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    backend_flags.restore(built.flags_before)
    return max(0, before - torch.cuda.memory_allocated(built.plan.device)) if cuda else 0
