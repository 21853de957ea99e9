"""LoRA training for every family, written as a recipe: setup() in dependency order, then an explicit loop.

Setup is phased so peak memory is one component at a time: the text encoders encode every caption
(and the sample prompts) and are freed; the VAE caches every latent and is freed; the denoiser
loads last, at its base precision (denoiser_setup). What a step means per family lives in
lora_objectives; which images form a batch lives in aspect_buckets.

Every random draw comes from one generator whose state is checkpointed with the LoRA weights, the
optimizer and the schedule, and the batch plan is a function of the seed and the step, so a
resumed run continues bit-identically.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from diffusion_kit.compile_errors import compile_failed, compiler_error, uncompile
from diffusion_kit.families import FAMILIES, FamilySpec
from diffusion_kit import recompile_watch
from diffusion_kit.precision import GRAPHS_DO_NOT_RELOAD, Precision
from diffusion_kit.resolved import Resolved, Source, Status
from training_service.recipe_config import RecipeConfig
from training_service import aspect_buckets
from training_service.encode_cache import EncodeCache, component_id, file_fingerprint
from training_service.graph_choice import graphs_over_shapes
from training_service.nf4_weights import record as nf4_weights_record
from training_service.denoiser_setup import load_denoiser, step_autocast, torch_dtype
from training_service.lora_objectives import Batch, objective_for
from training_service.optimizer_choice import optimizer_choice
from training_service.step_trace import StepTracer
from training_service.attention_choice import compile_cache_tag, sdpa_backends, training_attention

log = logging.getLogger("training_service.lora_recipe")

SAMPLE_STEPS_CAP = 20
SAMPLE_SEED = 1234


class TrainingDiverged(FloatingPointError):
    """A step's loss was not finite: the run diverged at `step` (1-based)."""

    def __init__(self, step: int, value: float):
        super().__init__(f"loss became {value} at step {step}")
        self.step, self.value = step, value


@dataclass
class StepReport:
    step: int
    total: int
    loss: float
    avg_loss: float
    lr: float
    grad_norm: float
    samples_per_s: float
    peak_memory_bytes: int
    elapsed_s: float
    eta_s: float
    yielded_s: float = 0.0  # of elapsed_s, paused for inference on this GPU (training_service.gpu_yield)
    peak_reserved_bytes: int = 0  # what the allocator held at most (tensors and its cache): what the lease covers


@dataclass
class StepInputs:
    x_t: torch.Tensor  # the noised latents, on the device at the base dtype
    t: torch.Tensor
    cond: dict
    target: torch.Tensor
    batch: Batch


@dataclass
class RunState:
    step: int = 0
    losses: list[float] = field(default_factory=list)


@dataclass
class Example:
    latent: torch.Tensor  # (C, h, w), fp32, CPU
    caption: str
    geometry: tuple[int, int, int, int, int, int]  # original h, w, crop top, left, target h, w
    bucket: tuple[int, int]


class LoraRecipe:
    def __init__(self, cfg: RecipeConfig, emit: Callable[[str, dict], None] = lambda kind, data: None):
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("CUDA was asked for and is not available")
        self.cfg = cfg
        self.family: FamilySpec = FAMILIES[cfg.family]
        self.emit = emit
        self.dtype = torch_dtype(cfg.precision)
        self.objective = objective_for(cfg.family, cfg.base_dir, self.family.default_guidance)
        self.generator = torch.Generator("cpu").manual_seed(cfg.seed)
        self.state = RunState()
        self.checkpointed_step: int | None = None  # the step the last checkpoint holds
        self.scaler = torch.amp.GradScaler("cuda") if cfg.precision == Precision.FP16 else None
        self.cache = EncodeCache(cfg.encode_cache_dir or None)
        self._trace_said = False  # the step_trace record is said once per run, however many train() calls it takes
        self.cuda_graphs = False  # cfg.cuda_graphs, once setup() finds the job's batch shapes few enough

    # ---- setup: text encoders, then the VAE, then the denoiser, each freed before the next loads --------

    def setup(self) -> None:
        self.conds, self.negative = self._encode_text()
        self.examples = self._cache_latents()
        self.plan = aspect_buckets.BatchPlan([ex.bucket for ex in self.examples], self.cfg.batch_size, self.cfg.seed)
        self.emit("phase", {"phase": "loading_transformer"})
        backend = self.cfg.compile_backend if self.cfg.compile else None
        if backend is not None and (tag := compile_cache_tag(self._attention_kernels())):
            torch.compiler.config.cache_key_tag = tag  # empty (no pin): an operator's tag stands
        shapes = len(self._one_batch_per_shape(sequences=True)) if backend is not None and self.cfg.cuda_graphs else 0
        self.cuda_graphs = bool(shapes) and self._graphs_fit(shapes)
        graphs = self.cuda_graphs
        ahead = backend is not None and bool(self.cfg.aot_dir) and not graphs
        phase = lambda phase, message: self.emit("phase", {"phase": phase, "message": message})  # noqa: E731
        recompile_watch.install()
        self.limit_hits_before = len(recompile_watch.hits())  # the process's so far
        self.limit_hits_said = False
        denoiser = load_denoiser(self.family, self.cfg.base_dir, self.cfg.precision, self.cfg.device,
                                 rank=self.cfg.rank, alpha=self.cfg.alpha, seed=self.cfg.seed,
                                 gradient_checkpointing=self.cfg.gradient_checkpointing,
                                 checkpoint_interval=self.cfg.checkpoint_interval,
                                 nf4_backend=self.cfg.nf4_backend,
                                 compile_backend=None if ahead or graphs else backend, phase=phase)
        for reason, message in denoiser.warnings:
            self.emit("warning", {"reason": reason, "message": message})
        if denoiser.precision == Precision.NF4:
            self.emit("resolved", {"resolved": [nf4_weights_record(self.cfg.nf4_backend).to_dict()]})
        self.model, self.params = denoiser.model, denoiser.params
        self.compiled = denoiser.compiled
        self.aot = self._ahead_of_time(backend, phase) if ahead else None
        self.aot_misses_said = False
        self.samples_compiled = self.compiled  # sample images run the blocks without gradients: other graphs
        self.graph_skips_said = False
        if graphs:
            self._compile_for_cuda_graphs(backend, phase, shapes)
        self.optimizer = self._optimizer()
        from diffusers.optimization import get_scheduler

        self.schedule = get_scheduler(self.cfg.lr_schedule, self.optimizer, num_warmup_steps=self.cfg.warmup_steps,
                                      num_training_steps=self.cfg.steps)

    def _ahead_of_time(self, backend: str, phase: Callable[[str, str], None]):
        """The blocks' training graphs (forward and backward) from disk, or compiled ahead of time and saved
        (diffusion_kit.aot_blocks), so a later job of the same base and settings skips tracing them. Loaded graphs
        are checked on this job's shapes (its buckets and batch size), and those they miss are compiled and saved
        beside them. Where they cannot be, the regular regional compile runs, and the record says why."""
        from diffusion_kit import aot_blocks

        model, cfg = self.model, self.cfg

        def regional() -> None:
            model.compile_repeated_blocks(dynamic=True, backend=backend)

        def fall_back(why: str) -> None:
            """No graphs kept: the record says why, and the regular regional compile runs."""
            self.emit("resolved", {"resolved": [aot_blocks.fell_back(why).to_dict()]})
            regional()
            self.compiled = True

        if Precision(cfg.precision) in GRAPHS_DO_NOT_RELOAD:
            return fall_back(f"{Precision(cfg.precision).proto_name} blocks' compiled graphs do not load back from "
                             "disk in a later job")
        phase("compiling", f"the repeated blocks' training graphs compiled ahead of time ({backend}): loading them, "
                           "or compiling and saving")
        env = aot_blocks.environment(cfg.device, {
            "backend": backend, "training": True, "precision": str(cfg.precision), "dtype": str(self.dtype),
            "gradient_checkpointing": cfg.gradient_checkpointing, "rank": cfg.rank, "alpha": cfg.alpha,
            "attention_pin": list(self._attention_kernels()),
            # graphs traced before the LoRA layers took their input uncast hold the casts: not these
            **({"lora_inputs": "as given"} if step_autocast(cfg.device, self.dtype) is not None else {}),
            # only where it is not every block, so the graphs kept before the interval existed still match
            **({"checkpoint_interval": cfg.checkpoint_interval}
               if cfg.gradient_checkpointing and cfg.checkpoint_interval > 1 else {})})

        def capture() -> None:
            """A forward with gradients, as training runs it, of one micro-batch of every shape the job trains on;
            the noise drawn is put back."""
            state = self.generator.get_state()
            try:
                for index in self._one_batch_per_shape():
                    self.loss(self.step_inputs(index))
            finally:
                self.generator.set_state(state)

        try:
            aot = aot_blocks.install(model, Path(cfg.aot_dir), env, capture, backend, {}, regional, grad=True,
                                     context=self._context, verify_loaded=True)
        except aot_blocks.AotUnavailable as e:
            return fall_back(e.why)
        self.compiled = True
        self.emit("resolved", {"resolved": [aot.record(where="the job's record; sample images, which run without "
                                                             "gradients, run the blocks eagerly").to_dict()]})
        self._free()
        return aot

    def _compile_for_cuda_graphs(self, backend: str, phase: Callable[[str, str], None], shapes: int) -> None:
        """The blocks compiled with static shapes for replay as CUDA graphs (inductor's graph trees): each block
        call's forward and backward recorded on its batch shape's first step, then replayed, one launch per call.
        Dynamo may keep several graphs per batch shape of the job (not its default of 8 in all); sample images,
        which run without gradients, run the blocks eagerly rather than record inference graphs beside the training
        ones. Graphs are not kept across jobs, and the record says so where the service keeps the others. On a CPU
        there is nothing to record: the blocks take the same static compile without the mode. `shapes`: the job's
        batch shapes (_one_batch_per_shape with sequences)."""
        from torch._dynamo.utils import counters

        from diffusion_kit import aot_blocks

        # a block's forward may take several graphs per batch shape (Z-Image's: a refiner's first call, on an
        # input without gradients, its later calls, the main blocks' calls on the joined sequence)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * shapes + 1)
        if self.cfg.aot_dir:
            self.emit("resolved", {"resolved": [aot_blocks.fell_back(
                "CUDA graphs are recorded in the job's own process, so its blocks are not compiled ahead of time "
                "(the compile caches on disk still serve a later job)").to_dict()]})
        phase("compiling", f"the repeated blocks for CUDA graph replay ({backend}, static shapes: {shapes} batch "
                           "shape(s), each recorded on its first step)")
        mode = {"mode": "reduce-overhead"} if self.cfg.device.startswith("cuda") else {}
        self.model.compile_repeated_blocks(dynamic=False, backend=backend, **mode)
        self.compiled, self.samples_compiled = True, False
        self.graph_skips_before = counters["inductor"]["cudagraph_skips"]  # the process's count so far

    def _say_graph_skips(self) -> None:
        """Inductor runs a graph it cannot record (a CPU tensor among its inputs, an input it mutates) without
        CUDA graphs, and only logs why: the job's record says how many, once."""
        from torch._dynamo.utils import counters

        if not self.cuda_graphs or self.graph_skips_said or not self.compiled:
            return
        skips = counters["inductor"]["cudagraph_skips"] - self.graph_skips_before
        if not skips:
            return
        self.graph_skips_said = True
        self.emit("resolved", {"resolved": [Resolved(
            "speed_mode", "regional_compile+cuda_graphs", "regional_compile+cuda_graphs", Source.AUTO, Status.FELL_BACK,
            f"{skips} compiled graph(s) of the blocks run without CUDA graphs (inductor could not record them; its "
            f"log says why), from step {self.state.step}").to_dict()]})

    def _say_recompile_limits(self) -> None:
        """Past dynamo's recompile limit a compiled block's calls on inputs its graphs do not cover run uncompiled
        for the rest of the job (recompile_watch): the trainer's log says so at each step it happens, the job's record
        at the first."""
        hits = recompile_watch.hits()[self.limit_hits_before:]
        if not hits or not self.compiled:
            return
        self.limit_hits_before += len(hits)
        log.warning("compiled functions reached dynamo's recompile limit", extra={"fields": {
            "event": "training.recompile_limit", "step": self.state.step, "functions": [h.describe() for h in hits]}})
        if self.limit_hits_said:
            return
        self.limit_hits_said = True
        mode = "regional_compile+cuda_graphs" if self.cuda_graphs else "regional_compile"
        self.emit("resolved", {"resolved": [Resolved(
            "speed_mode", mode, f"{mode}, partly uncompiled", Source.AUTO, Status.FELL_BACK,
            f"{'; '.join(h.describe() for h in hits)} by step {self.state.step}: its calls on inputs no compiled "
            "graph covers run uncompiled from then on").to_dict()]})

    def _one_batch_per_shape(self, sequences: bool = False) -> list[int]:
        """The first micro-batch of each bucket and batch size in the first epoch's plan (every epoch has the same
        shapes): a graph traced on one bucket's shapes may not cover another's, whose calls would then run eagerly.
        With `sequences`, also of each shape the captions' conditioning takes (Z-Image's sequence is its caption's
        length): what graphs of static shapes tell apart."""
        first: dict[tuple, int] = {}
        for index in range(self.plan.per_epoch):
            chosen = self.plan.at(index)
            key = (self.examples[chosen[0]].bucket, len(chosen))
            if sequences:
                conds = [self.conds[self.examples[i].caption] for i in chosen]
                key += (self.objective.shape_key(self.objective.collate(conds)),)
            first.setdefault(key, index)
        return sorted(first.values())

    def _graphs_fit(self, shapes: int) -> bool:
        """Whether the job's `shapes` batch shapes are few enough for CUDA graphs (graph_choice); if not, the
        record says so and the blocks take the regular compile."""
        choice = graphs_over_shapes(shapes)
        if not choice.on:
            self.emit("resolved", {"resolved": [Resolved(
                "speed_mode", "regional_compile+cuda_graphs", "regional_compile", Source.AUTO, Status.FELL_BACK,
                choice.reason).to_dict()]})
        return choice.on

    def _optimizer(self):
        choice = optimizer_choice(self.cfg.optimizer, self.cfg.device)
        if choice.name == "adamw8bit":
            import bitsandbytes

            return bitsandbytes.optim.AdamW8bit(self.params, lr=self.cfg.learning_rate)
        return torch.optim.AdamW(self.params, lr=self.cfg.learning_rate, fused=choice.fused)

    def _pipeline(self, **components):
        import diffusers

        return getattr(diffusers, self.family.pipeline_class).from_pretrained(
            self.cfg.base_dir, dtype=self.dtype if self.cfg.device != "cpu" else torch.float32, **components)

    def _encode_text(self) -> tuple[dict[str, dict], dict | None]:
        """Each distinct caption once, the sample prompts, and the negative prompt where sampling uses CFG.
        The text encoders load only when some text is not in the encode cache."""
        texts = sorted({caption for _, caption in self.cfg.examples} | set(self.cfg.sample_prompts))
        negative_text = self.objective.negative_prompt if self.cfg.sample_every and self._sample_guidance()[1] else None
        wanted = texts + ([negative_text] if negative_text is not None and negative_text not in texts else [])
        components = component_id(self.cfg.base_dir, self._text_components()) if self.cache.root else ""
        keep = self._keep_dtype()

        def key(text: str) -> dict:
            return {"objective": type(self.objective).__name__, "components": components, "text": text,
                    "dtype": str(keep)}

        found = {text: self.cache.get("text", key(text)) for text in wanted}
        missing = [text for text in wanted if found[text] is None]
        self.emit("phase", {"phase": "encoding_text", "message": self._cache_note(len(wanted), len(missing), "texts")})
        if missing:
            pipe = self._pipeline(**{self.family.denoiser: None, "vae": None})
            pipe.to(self.cfg.device)
            with torch.no_grad():
                for text in missing:
                    found[text] = self._cpu(self.objective.encode_caption(pipe, text, self.cfg.device))
                    self.cache.put("text", key(text), found[text])
            del pipe
            self._free()
        return {text: found[text] for text in texts}, (found[negative_text] if negative_text is not None else None)

    def _cache_note(self, total: int, encoded: int, what: str) -> str:
        if self.cache.root is None:
            return f"{total} {what}, no encode cache"
        return f"{total} {what}: {total - encoded} from the encode cache, {encoded} encoded"

    def _keep_dtype(self) -> torch.dtype:
        return torch.float32 if self.cfg.device == "cpu" else self.dtype

    def _cpu(self, cond: dict) -> dict:
        """Kept on the CPU in the dtype the step feeds the model (a FLUX caption is 512 x 4096 values)."""
        keep = self._keep_dtype()
        return {k: v.detach().to("cpu", keep) if v.is_floating_point() else v.detach().cpu() for k, v in cond.items()}

    def _cache_latents(self) -> list[Example]:
        """One latent per image at its crop. The VAE loads only when some image is not in the encode cache."""
        import diffusers
        from PIL import Image

        vae_dtype = torch.float32 if self.cfg.device == "cpu" or self.family.key == "sdxl" else self.dtype
        vae_id = component_id(self.cfg.base_dir, ["vae"]) if self.cache.root else ""
        sizes = aspect_buckets.bucket_sizes(self.cfg.resolution)
        planned = []
        for path, caption in self.cfg.examples:
            with Image.open(path) as opened:  # the header only: the size decides the crop
                width, height = opened.size
            square = (self.cfg.resolution, self.cfg.resolution)
            target = aspect_buckets.nearest_bucket(width, height, sizes) if self.cfg.buckets else square
            resize, box = aspect_buckets.crop_box(width, height, target)
            key = {"objective": type(self.objective).__name__, "vae": vae_id, "image": file_fingerprint(path),
                   "resize": resize, "box": box, "dtype": str(vae_dtype)}
            found = self.cache.get("latents", key)
            planned.append((path, caption, (height, width, box[1], box[0], target[1], target[0]), target, resize,
                            box, key, found["latent"] if found else None))
        missing = sum(1 for *_, latent in planned if latent is None)
        self.emit("phase", {"phase": "caching_latents", "message": self._cache_note(len(planned), missing, "images")})
        vae = None
        if missing:
            vae = getattr(diffusers, self.objective.vae_class).from_pretrained(
                self.cfg.base_dir, subfolder="vae", dtype=vae_dtype).to(self.cfg.device)
        out = []
        for path, caption, geometry, target, resize, box, key, latent in planned:
            if latent is None:
                latent = self._encode_image(vae, vae_dtype, path, resize, box)
                self.cache.put("latents", key, {"latent": latent})
            out.append(Example(latent, caption, geometry, target))
        if vae is not None:
            del vae
            self._free()
        return out

    def _encode_image(self, vae, vae_dtype: torch.dtype, path: str, resize, box) -> torch.Tensor:
        import numpy as np
        from PIL import Image

        with Image.open(path) as opened:
            image = opened.convert("RGB")
        cropped = image.resize(resize, Image.Resampling.BICUBIC).crop(box)
        pixels = torch.from_numpy(np.asarray(cropped, dtype=np.float32).copy()).permute(2, 0, 1)
        pixels = (pixels / 127.5 - 1).unsqueeze(0).to(self.cfg.device, vae_dtype)
        with torch.no_grad():
            return self.objective.encode_image(vae, pixels)[0].float().cpu()

    def _free(self) -> None:
        import gc

        gc.collect()
        if self.cfg.device.startswith("cuda"):
            torch.cuda.empty_cache()

    # ---- the loop ------------------------------------------------------------------------------------

    def _attention_kernels(self) -> tuple[str, ...]:
        """The SDPA kernels the step pins: the job's, or the policy's (training_service.attention_choice)."""
        return training_attention(self.cfg.family, self.cfg.device, tuple(self.cfg.attention)).kernels

    def _attention_pin(self):
        """Attention pinned to the chosen fused SDPA kernels on CUDA, in order. Held over backward too: gradient
        checkpointing recomputes the forward there, and a different kernel saves different tensors
        (CheckpointError)."""
        kernels = self._attention_kernels()
        if not kernels:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(sdpa_backends(kernels), set_priority=True)

    def _context(self):
        """The forward's context: the attention pin, and bf16/fp16 autocast over fp32 LoRA parameters."""
        stack = contextlib.ExitStack()
        stack.enter_context(self._attention_pin())
        if (autocast := step_autocast(self.cfg.device, self.dtype)) is not None:
            stack.enter_context(torch.autocast("cuda", dtype=autocast))
        return stack

    def _batch(self, step: int) -> Batch:
        idx = self.plan.at(step)
        chosen = [self.examples[i] for i in idx]
        return Batch(torch.stack([ex.latent for ex in chosen]),
                     self.objective.collate([self.conds[ex.caption] for ex in chosen]),
                     [ex.geometry for ex in chosen])

    def _cond_to_device(self, cond: dict) -> dict:
        return {key: self._to_device(v) for key, v in cond.items()}

    def _to_device(self, value):
        if isinstance(value, list):
            return [self._to_device(v) for v in value]
        if value.is_floating_point():
            return value.to(self.cfg.device, self.dtype)
        return value.to(self.cfg.device)

    def step_inputs(self, index: int) -> StepInputs:
        """Micro-batch `index` noised and on the device: what one forward takes. The host only draws the noise;
        the noising runs on the device (the host's elementwise ops on a latent ran slow and uneven on a busy host,
        and the GPU waited on them at each step's start)."""
        batch = self._batch(index)
        # every host-to-device copy before the forward is queued: a pageable copy waits for the stream
        x_t, t, target = self.objective.noisy(batch.x0.to(self.cfg.device), self.generator)
        cond = self._cond_to_device(batch.cond)
        return StepInputs(x_t.to(self.dtype), self._to_device(t), cond, target, batch)

    def loss(self, inputs: StepInputs) -> torch.Tensor:
        """The forward under the step's context (attention pin, autocast) and its MSE loss, in fp32."""
        with self._context():
            pred = self.objective.predict(self.model, inputs.x_t, inputs.t, inputs.cond, inputs.batch)
            return torch.nn.functional.mse_loss(pred.float(), inputs.target.float())

    def backward(self, loss: torch.Tensor) -> None:
        """Backward under the attention pin (checkpointed blocks recompute their forward here), scaled in fp16."""
        with self._attention_pin():
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def train(self, should_stop: Callable[[], bool] = lambda: False, checkpoint_dir: Path | None = None,
              sample_dir: Path | None = None, until_step: int | None = None,
              pause: Callable[[int, str], float] | None = None, trace_dir: Path | None = None) -> RunState:
        """Steps until cfg.steps (or `until_step`, sooner) or until should_stop() says so. `pause(step, where)`
        runs at each step boundary and between each forward and backward pass (it may wait there: the GPU is
        yielded to inference) and returns the seconds it waited. With cfg.trace_steps, those steps run under the
        profiler and `trace_dir` gets what it saw (step_trace)."""
        device = self.cfg.device
        last = self.cfg.steps if until_step is None else min(until_step, self.cfg.steps)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()  # the step's peak, not the load's (int8 quantises on the GPU)
        tracer = self._tracer(trace_dir, last)
        # marks a traced step's parts for the profiler; nullcontext(name) is nothing, as the phase of an untraced one
        loop_phase = tracer.phase if tracer else contextlib.nullcontext
        started, first_step = time.perf_counter(), self.state.step
        last_saved = started
        yielded = 0.0
        while self.state.step < last and not should_stop():
            if pause:
                yielded += pause(self.state.step, "between steps")
                if should_stop():
                    break
            if tracer:
                tracer.before(self.state.step)
            t0 = time.perf_counter()
            if self.compiled and self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs may be overwritten now
            noise_state = self.generator.get_state() if self.compiled else None
            try:
                loss, images, waited = self._accumulate_gradients(self.state.step, pause, loop_phase)
            except Exception as e:  # noqa: BLE001 - only the compiler's own failures are retried
                if not (self.compiled and compile_failed(e)):
                    raise
                self._stop_compiling(e)
                self.generator.set_state(noise_state)  # the same noise as the step that failed would have had
                loss, images, waited = self._accumulate_gradients(self.state.step, pause, loop_phase)
            yielded += waited
            t0 += waited  # the step's own time, for its images per second
            with loop_phase("optimizer"):
                if self.scaler is not None:
                    self.scaler.unscale_(self.optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                lr = self.schedule.get_last_lr()[0]  # the rate this step used
                self.schedule.step()
                self.optimizer.zero_grad(set_to_none=True)
            self.state.step += 1
            with loop_phase("report"):  # the loss read waits for the step to finish on the device
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise TrainingDiverged(self.state.step, value)
                self.state.losses.append(value)
                self._say_eager_calls()
                self._say_graph_skips()
                self._say_recompile_limits()
                now = time.perf_counter()
                window = self.state.losses[-20:]
                peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0
                reserved = torch.cuda.max_memory_reserved() if device.startswith("cuda") else 0
                per_step = (now - started - yielded) / (self.state.step - first_step)
                self.emit("step", asdict(StepReport(
                    self.state.step, self.cfg.steps, value, sum(window) / len(window), lr,
                    float(grad_norm), images / max(1e-9, now - t0), peak, now - started,
                    per_step * (self.cfg.steps - self.state.step), yielded, reserved)))
            if tracer:
                tracer.after(self.state.step)
            every, minutes = self.cfg.checkpoint_every, self.cfg.checkpoint_minutes
            if checkpoint_dir and ((every and self.state.step % every == 0)
                                   or (minutes and time.perf_counter() - last_saved >= minutes * 60)):
                self.save_checkpoint(checkpoint_dir)
                last_saved = time.perf_counter()
            if sample_dir and self.cfg.sample_every and self.state.step % self.cfg.sample_every == 0:
                self.render_samples(sample_dir)
        if tracer:
            tracer.finish()  # stopped inside the window: what it saw
        return self.state

    def _tracer(self, trace_dir: Path | None, last: int) -> StepTracer | None:
        """The profiler over cfg.trace_steps, said in the job's record: those steps run slower than the others."""
        if not (self.cfg.trace_steps and trace_dir) or self._trace_said:
            return None  # no window, or an earlier call traced it or said why it could not
        first, count = self.cfg.trace_steps
        if last < first <= self.cfg.steps:
            return None  # this call stops short of the window (until_step); a later one reaches it
        self._trace_said = True
        asked = f"steps {first}-{first + count - 1}"
        if first <= self.state.step or first > last:
            self.emit("resolved", {"resolved": [Resolved(
                "step_trace", asked, "none", Source.EXPLICIT, Status.FELL_BACK,
                f"this run trains steps {self.state.step + 1}-{self.cfg.steps}, outside the window").to_dict()]})
            return None
        count = min(count, last - first + 1)  # the run ends inside the window
        self.emit("resolved", {"resolved": [Resolved(
            "step_trace", asked, f"steps {first}-{first + count - 1} under torch.profiler, kept in the job folder's "
            "trace/", Source.EXPLICIT,
            reason="the service's --trace-steps; traced steps run slower than the others").to_dict()]})
        return StepTracer((first, count), trace_dir, self.cfg.device,
                          say=lambda what: log.info(what, extra={"fields": {"event": "training.step_trace"}}))

    def _stop_compiling(self, error: BaseException) -> None:
        """The compiler failed on the denoiser's blocks (the first step traces them): the blocks run their own
        forward from now on, gradients of the failed attempt are dropped, and the job's record and stream say why."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.aot is not None:
            self.aot.discard()
        uncompile(self.model)
        self.compiled = False
        why = f"the compiler failed on the denoiser's blocks ({compiler_error(error)}); training continues uncompiled"
        self.emit("resolved", {"resolved": [Resolved("speed_mode", "regional_compile", "eager", Source.AUTO,
                                                     Status.FELL_BACK, why).to_dict()]})
        self.emit("warning", {"reason": "COMPILE_FELL_BACK", "message": why})

    def _say_eager_calls(self) -> None:
        """The first step in which some block call ran eagerly (no graph compiled ahead of time covered it), in
        the job's record; every such step in the trainer's log."""
        misses = self.aot.take_misses() if self.aot is not None and self.aot.installed else 0
        if not misses:
            return
        log.warning("block calls ran eagerly", extra={"fields": {
            "event": "training.aot_eager_calls", "step": self.state.step, "calls": misses}})
        if not self.aot_misses_said:
            self.aot_misses_said = True
            record = self.aot.miss_record(misses)
            record = replace(record, applied=f"{record.applied} at step {self.state.step}")
            self.emit("resolved", {"resolved": [record.to_dict()]})

    def _accumulate_gradients(self, step: int, pause: Callable[[int, str], float] | None = None,
                              loop_phase: Callable[[str], contextlib.AbstractContextManager] = contextlib.nullcontext
                              ) -> tuple[torch.Tensor, int, float]:
        """The gradients of `accumulation` batches, each loss scaled so they add up to their mean's gradient; and
        the seconds `pause` waited between a forward and its backward (the backward is most of a step: a pause
        here lets inference in up to that much sooner than waiting for the step's end)."""
        parts, images, waited = [], 0, 0.0
        for k in range(self.cfg.accumulation):
            with loop_phase("inputs"):
                inputs = self.step_inputs(step * self.cfg.accumulation + k)
            with loop_phase("forward"):
                loss = self.loss(inputs) / self.cfg.accumulation
            if pause:
                waited += pause(step, "between the forward and backward passes of step")
            with loop_phase("backward"):
                self.backward(loss)
            parts.append(loss.detach())
            images += len(inputs.batch.geometry)
        return torch.stack(parts).sum(), images, waited

    # ---- sample images -------------------------------------------------------------------------------

    def _sample_guidance(self) -> tuple[str, bool]:
        """The guidance keyword and whether the sample runs CFG (so needs a negative prompt)."""
        f = self.family
        return f.guidance_kwarg, f.guidance_is_cfg and f.default_guidance > 1

    def render_samples(self, directory: Path) -> list[Path]:
        """The sample prompts through the family's own pipeline with the adapter as trained so far."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        none = {name: None for name in self._text_components()}
        pipe = self._pipeline(**{self.family.denoiser: self.model}, **none)
        pipe.vae.to(self.cfg.device)
        pipe.set_progress_bar_config(disable=True)
        kwarg, cfg_on = self._sample_guidance()
        was_training = self.model.training
        self.model.eval()
        paths = []
        try:
            for k, prompt in enumerate(self.cfg.sample_prompts):
                cond = self._cond_to_device(self.conds[prompt])
                negative = (self._cond_to_device(self.negative)
                            if cfg_on and self.negative is not None else None)
                kwargs = dict(self.objective.sample_kwargs(cond, negative), height=self.cfg.resolution,
                              width=self.cfg.resolution,
                              num_inference_steps=min(self.family.default_steps, SAMPLE_STEPS_CAP),
                              **{kwarg: self.family.default_guidance})
                image = self._sample_image(pipe, kwargs)
                path = directory / f"step-{self.state.step:06d}-{k}.png"
                image.save(path)
                paths.append(path)
                self.emit("sample", {"step": self.state.step, "prompt": prompt, "path": str(path)})
        finally:
            if self.aot is not None:
                self.aot.take_misses()  # the samples' own calls, without gradients: eager, as the record said
            self.model.train(was_training)
            pipe.vae.to("cpu")
            del pipe
            self._free()
        return paths

    def _sample_image(self, pipe, kwargs: dict):
        """One sample image, from the sample seed. Compiled blocks meet sample images with gradients off, so they
        trace new graphs mid-job: if the compiler fails there, this and later samples render uncompiled (training
        keeps its graphs) and the job is told once."""
        def render():
            with torch.no_grad(), self._context(), (
                    contextlib.nullcontext() if self.samples_compiled or not self.compiled
                    else torch.compiler.set_stance("force_eager")):
                return pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(SAMPLE_SEED)).images[0]

        try:
            return render()
        except Exception as e:  # noqa: BLE001 - only the compiler's own failures are retried
            if not (self.compiled and self.samples_compiled and compile_failed(e)):
                raise
            error = compiler_error(e)
        self.samples_compiled = False
        why = f"the compiler failed on the sample images' graphs ({error}); samples render uncompiled, training stays compiled"
        self.emit("resolved", {"resolved": [Resolved("sample_compile", "regional_compile", "eager", Source.AUTO,
                                                     Status.FELL_BACK, why).to_dict()]})
        self.emit("warning", {"reason": "COMPILE_FELL_BACK", "message": why})
        return render()

    def _text_components(self) -> list[str]:
        index = json.loads((Path(self.cfg.base_dir) / "model_index.json").read_text())
        return [name for name in index if name.startswith(("text_encoder", "tokenizer"))]

    # ---- checkpoints: atomic, identity-checked -------------------------------------------------------

    def lora_state(self) -> dict[str, torch.Tensor]:
        from peft.utils import get_peft_model_state_dict

        return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def save_checkpoint(self, directory: Path) -> Path:
        """Written to a staging folder, then renamed over the previous checkpoint in one step."""
        import os
        import shutil

        directory = Path(directory)
        staging = directory.with_name(directory.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            torch.save({"lora": self.lora_state(), "optimizer": self.optimizer.state_dict(),
                        "schedule": self.schedule.state_dict(), "generator": self.generator.get_state(),
                        "scaler": self.scaler.state_dict() if self.scaler else None,
                        "step": self.state.step, "losses": self.state.losses}, staging / "state.pt")
            (staging / "identity.json").write_text(json.dumps(self.cfg.identity(), sort_keys=True))
        except BaseException:  # a full disk: the previous checkpoint stays, and no half-written one is left
            shutil.rmtree(staging, ignore_errors=True)
            raise
        old = directory.with_name(directory.name + ".old")
        if directory.exists():
            os.replace(directory, old)
        os.replace(staging, directory)
        shutil.rmtree(old, ignore_errors=True)
        self.checkpointed_step = self.state.step
        self.emit("checkpoint", {"step": self.state.step, "path": str(directory)})
        return directory

    def load_checkpoint(self, directory: Path) -> None:
        from peft.utils import set_peft_model_state_dict

        changed = self.cfg.identity_differences(json.loads((Path(directory) / "identity.json").read_text()))
        if changed:
            raise ValueError(f"checkpoint {directory} belongs to a different run (differs in {', '.join(changed)})")
        saved = torch.load(Path(directory) / "state.pt", weights_only=False)
        set_peft_model_state_dict(self.model, saved["lora"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.schedule.load_state_dict(saved["schedule"])
        self.generator.set_state(saved["generator"])
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        self.state = RunState(saved["step"], saved["losses"])

    def export_adapter(self, directory: Path) -> Path:
        """The diffusers/peft layout, with the LoRA config in the safetensors metadata so alpha reloads right."""
        import diffusers
        from peft.utils import get_peft_model_state_dict

        config = self.model.peft_config["default"].to_dict()
        config["target_modules"] = sorted(config["target_modules"])
        pipeline_cls = getattr(diffusers, self.family.pipeline_class)
        layers = {k: v.detach().float().cpu() for k, v in get_peft_model_state_dict(self.model).items()}
        pipeline_cls.save_lora_weights(
            str(directory), **{f"{self.family.denoiser}_lora_layers": layers,
                               f"{self.family.denoiser}_lora_adapter_metadata": config})
        return Path(directory)
