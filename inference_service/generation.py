"""One generation: the request checked against the loaded model, then the pipeline call with per-step progress.

Cancellation is checked before every model call: the text encoders, each denoiser call (every
step, and each half of a guided one) and the VAE decode; a call already running finishes first.
So a cancel (or an expired deadline) during the encode skips the denoise, and one after the last
step skips the decode of an image nobody wants.
"""
from __future__ import annotations

import contextlib
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from diffusion_kit.families import FamilySpec
from diffusion_kit.resolved import Resolved, Source, Status
from inference_service import batch_plan, image_room, oom_backoff, step_cache
from inference_service.model_limits import ModelLimits
from inference_service.requests import AdapterUse, GenerateRequest
from service_kit.errors import Cancelled, InvalidArgument, Unavailable, clip

MAX_STEPS = 200
MAX_IMAGES = 16
# The pixels of one request's images together: a raw 4096x4096x4 result (192 MiB) still fits one response.
MAX_TOTAL_PIXELS = 64 * 2**20


@dataclass(frozen=True)
class GenerationSpec:
    model_id: str
    prompt: str
    negative_prompt: str
    width: int
    height: int
    steps: int
    guidance: float
    seeds: tuple[int, ...]
    adapters: tuple[AdapterUse, ...]
    output_format: str  # png | webp | jpeg | raw_rgb8
    encode_quality: int | None
    resolved: tuple[Resolved, ...]
    step_cache: float | None = None  # First-Block Cache threshold; None: every step runs every block
    pixels_per_call: int = image_room.MEASURED_PIXELS  # the loaded model's image room (image_room, batch_plan)

    def recipe(self, family: FamilySpec, seed: int, model_resolved: list[Resolved]) -> dict:
        """What the image's metadata records: enough to make it again."""
        settings = {r.control: r.applied for r in model_resolved}
        return {"model_id": self.model_id, "family": family.key, "prompt": self.prompt,
                "negative_prompt": self.negative_prompt, "width": self.width, "height": self.height,
                "steps": self.steps, "guidance_scale": self.guidance, "seed": seed,
                "adapters": [{"id": a.adapter_id, "weight": a.weight} for a in self.adapters],
                "settings": settings,
                **({"step_cache": {"mode": step_cache.FIRST_BLOCK, "threshold": self.step_cache}}
                   if self.step_cache is not None else {})}


def parse_generate(req: GenerateRequest, family: FamilySpec, limits: ModelLimits) -> GenerationSpec:
    """Validates against the loaded model and fills the family's defaults, recording each choice."""
    if not req.prompt.strip():
        raise InvalidArgument("prompt is required", reason="MISSING_PROMPT", field="prompt")
    if limits.max_prompt_tokens and limits.count_prompt_tokens is not None:
        for name, text in (("prompt", req.prompt), ("negative_prompt", req.negative_prompt)):
            count = limits.count_prompt_tokens(text) if text else 0
            if count > limits.max_prompt_tokens:
                raise InvalidArgument(f"{name} is {count} tokens; this model has positions for "
                                      f"{limits.max_prompt_tokens} (its loaded record's limits)",
                                      reason="PROMPT_TOO_LONG", field=name)
    if req.negative_prompt and not family.takes_negative_prompt:
        raise InvalidArgument(f"{family.display} takes no negative prompt", reason="NEGATIVE_PROMPT_UNSUPPORTED")
    resolved = []

    def default(control, value, fallback):
        if value:
            return value
        resolved.append(Resolved(control, "unset", str(fallback), Source.DEFAULT, reason=f"{family.display} default"))
        return fallback

    multiple = limits.size_multiple
    width = default("width", req.width, min(family.default_resolution, limits.max_width))
    height = default("height", req.height, min(family.default_resolution, limits.max_height))
    for name, side, top in (("width", width, limits.max_width), ("height", height, limits.max_height)):
        if side < multiple or side > top or side % multiple:
            raise InvalidArgument(f"{name} must be a multiple of {multiple} between {multiple} and {top} (this "
                                  f"model's limit), got {side}", reason="BAD_SIZE", field=name)
    image_room.check(width, height, limits.max_pixels_per_call, req.model_id)
    steps = default("steps", req.steps, family.default_steps)
    if not 1 <= steps <= MAX_STEPS:
        raise InvalidArgument(f"steps must be 1..{MAX_STEPS}, got {steps}", reason="BAD_STEPS")
    if req.guidance_scale is not None:
        guidance = req.guidance_scale
        if not 0 <= guidance <= 30:
            raise InvalidArgument(f"guidance_scale must be 0..30, got {guidance}", reason="BAD_GUIDANCE")
    else:
        guidance = family.default_guidance
        resolved.append(Resolved("guidance_scale", "unset", str(guidance), Source.DEFAULT,
                                 reason=f"{family.display} default"))
    if req.num_images and req.seeds and req.num_images != len(req.seeds):
        raise InvalidArgument(f"num_images is {req.num_images} but {len(req.seeds)} seeds were given",
                              reason="SEED_COUNT_MISMATCH")
    count = req.num_images or len(req.seeds) or 1
    if not 1 <= count <= MAX_IMAGES:
        raise InvalidArgument(f"num_images must be 1..{MAX_IMAGES}, got {count}", reason="BAD_NUM_IMAGES",
                              field="num_images")
    if count * width * height > MAX_TOTAL_PIXELS:
        raise InvalidArgument(f"{count} images of {width}x{height} exceed the {MAX_TOTAL_PIXELS // 2**20} Mi pixels "
                              "one request may return; ask for fewer or smaller images", reason="TOO_MANY_PIXELS",
                              field="num_images")
    if any(s < 0 for s in req.seeds):
        raise InvalidArgument("seeds must be >= 0", reason="BAD_SEED")
    seeds = tuple(req.seeds) or tuple(secrets.randbits(63) for _ in range(count))
    if not req.seeds:
        resolved.append(Resolved("seeds", "unset", ",".join(map(str, seeds)), Source.AUTO, reason="random"))
    adapters = list(req.adapters)
    for a in adapters:
        if not a.adapter_id:
            raise InvalidArgument("adapters[].adapter_id is required", reason="MISSING_ADAPTER_ID")
        if not 0 <= a.weight <= 2:
            raise InvalidArgument(f"adapter {clip(a.adapter_id)} weight must be 0..2, got {a.weight}",
                                  reason="BAD_ADAPTER_WEIGHT")
    if len({a.adapter_id for a in adapters}) != len(adapters):
        raise InvalidArgument("an adapter may appear once per request", reason="DUPLICATE_ADAPTER")
    quality = req.encode_quality
    if quality is not None:
        lo, hi = (0, 9) if req.output_format == "png" else (1, 100)
        if not lo <= quality <= hi:
            raise InvalidArgument(f"encode_quality for IMAGE_FORMAT_{req.output_format.upper()} must be {lo}..{hi}",
                                  reason="BAD_QUALITY")
    negative = req.negative_prompt
    if family.guidance_kwarg == "true_cfg_scale" and guidance > 1 and not negative:
        negative = " "  # Qwen-Image runs CFG only with a negative prompt; a blank one is its documented default
        resolved.append(Resolved("negative_prompt", "unset", "' '", Source.AUTO,
                                 reason="true CFG needs a negative prompt; a blank one was used"))
    cache = step_cache.parse(req.step_cache, family.key, family.display)
    return GenerationSpec(req.model_id, req.prompt, negative, width, height, steps, guidance, seeds,
                          tuple(adapters), req.output_format, quality, tuple(resolved), cache,
                          limits.max_pixels_per_call)


@dataclass
class StepReport:
    step: int
    total: int
    elapsed_s: float
    eta_s: float
    attempt: int = 1  # the generation's run: 2 when it ran again after the compiler failed (engine)


@dataclass
class GenerationOutput:
    images: list
    encode_prompt_s: float
    denoise_s: float
    decode_s: float
    peak_memory_bytes: int = 0
    tiling: Resolved | None = None
    step_cache: Resolved | None = None
    prompt_encoding: Resolved | None = None  # whether the text encoders ran or a repeat was reused
    prompt_counts: tuple[int, int] = (0, 0)  # encode_prompt calls: (reused, encoded)
    batch_split: Resolved | None = None  # the images ran as smaller batches after running out of GPU memory
    retrace: Resolved | None = None  # a compiled model traced new graphs for this generation
    new_graphs: int = 0
    images_per_call: Resolved | None = None  # the images ran as several calls, planned (batch_plan)


@dataclass
class RunControl:
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    # What the stream ends with: CANCELLED for a caller's cancel, UNAVAILABLE when the model is going away.
    cancel_error: Exception | None = None
    # False while the model's broker lease is not held (lost, not yet re-granted): no device work then.
    still_leased: Callable[[], bool] = lambda: True

    def stop(self, reason: str, error: Exception | None = None) -> None:
        self.cancel_reason, self.cancel_error = reason, error
        self.cancel.set()


class _CancelPoints:
    """Raises the cancel error before the next model call: text encoders, denoiser, VAE decoder."""

    def __init__(self, pipe, denoiser: str, check: Callable[[str], None]):
        self.handles = []
        modules = [(name, getattr(pipe, name, None)) for name in ("text_encoder", "text_encoder_2", "text_encoder_3")]
        modules += [(denoiser, getattr(pipe, denoiser, None)),
                    ("vae decode", getattr(getattr(pipe, "vae", None), "decoder", None))]
        for what, module in modules:
            if module is not None:
                self.handles.append(module.register_forward_pre_hook(lambda *_, what=what: check(what)))

    def close(self):
        for h in self.handles:
            h.remove()


class _EncodeTimer:
    """Times the text encoders through forward hooks: first entry to last exit."""

    def __init__(self, pipe):
        self.start = self.end = None
        self.handles = []
        for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
            module = getattr(pipe, name, None)
            if module is not None:
                self.handles.append(module.register_forward_pre_hook(self._pre))
                self.handles.append(module.register_forward_hook(self._post))

    def _pre(self, *_):
        if self.start is None:
            self.start = time.perf_counter()

    def _post(self, *_):
        self.end = time.perf_counter()

    def close(self):
        for h in self.handles:
            h.remove()


def choose_tiling(tier_may_tile: bool, width: int, height: int) -> Resolved:
    from inference_service.memory_plan import TILE_ABOVE_PIXELS

    tile = tier_may_tile and width * height > TILE_ABOVE_PIXELS
    why = (f"{width}x{height} is above {TILE_ABOVE_PIXELS / 1e6:.1f} MP in an offload tier" if tile
           else "decoded whole (exact)")
    return Resolved("vae_tiling_this_image", "auto", "on" if tile else "off", Source.AUTO, reason=why)


def pil_images(pixels) -> list:
    """The pipeline's decoded images (float, 0 to 1, N x C x H x W, on its device) as PIL images, the 8-bit
    rounding done where they are: the same pixels as the pipeline's own "pil" output, which moves the floats
    to the host and rounds them there (tens of milliseconds of CPU for a 1024x1024 image)."""
    import torch
    from PIL import Image

    with torch.inference_mode():
        pixels = pixels.float().mul_(255).round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        arrays = pixels.contiguous().cpu().numpy()
    return [Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a) for a in arrays]


def run(pipe, family: FamilySpec, spec: GenerationSpec, control: RunControl, on_step: Callable[[StepReport], None],
        on_phase: Callable[[str], None], inference_mode: bool, tier_may_tile: bool = False,
        prompts=None) -> GenerationOutput:
    """One generation: one pipeline call for all its images, or smaller batches after running out of GPU memory
    (inference_service.oom_backoff). `prompts`: the model's PromptCache (inference_service.prompt_cache), or None."""
    import torch

    t_call = time.perf_counter()
    per_call = batch_plan.images_per_call(len(spec.seeds), spec.width, spec.height, spec.pixels_per_call)
    # progress counts the steps of every call: base is the steps of the calls done
    marks = {"first_step": None, "last_step": None, "done": 0, "base": 0,
             "total": spec.steps * -(-len(spec.seeds) // per_call)}

    def check(before: str) -> None:
        if not control.still_leased():
            raise Unavailable(f"the GPU lease was lost before the {before} call (after step {marks['done']} of "
                              f"{marks['total']}); no work runs outside a lease. Retry once it is granted again",
                              reason="NO_LEASE")
        if control.cancel.is_set():
            raise control.cancel_error or Cancelled(
                f"generation cancelled before the {before} call (after step {marks['done']} of {marks['total']}): "
                f"{control.cancel_reason}", reason="GENERATION_CANCELLED")

    pace = _StepPace()

    def callback(_pipe, index, _timestep, tensors):
        pace(tensors.get("latents"), last=index + 1 == spec.steps)
        now = time.perf_counter()
        done = marks["done"] = marks["base"] + index + 1
        marks["total"] = max(marks["total"], marks["base"] + spec.steps)  # more calls after running out of memory
        check("next")
        if marks["first_step"] is None:
            marks["first_step"] = timer.end or t_call
            on_phase("denoising")
        marks["last_step"] = now
        elapsed = now - marks["first_step"]
        total = marks["total"]
        on_step(StepReport(done, total, elapsed, elapsed / done * (total - done)))
        if done == total:
            on_phase("decoding")
        return tensors

    kwargs = {"prompt": spec.prompt, "height": spec.height, "width": spec.width, "num_inference_steps": spec.steps,
              "callback_on_step_end": callback, family.guidance_kwarg: spec.guidance, "output_type": "pt"}
    if spec.negative_prompt:
        kwargs["negative_prompt"] = spec.negative_prompt
    passes = [0, 0]  # step caching: denoiser passes that ran every block, and all passes

    def call(seeds) -> list:
        """One pipeline call for these seeds, each image its own generator; the step cache (if asked) for it."""
        caching = (step_cache.first_block(getattr(pipe, family.denoiser), spec.step_cache)
                   if spec.step_cache is not None else contextlib.nullcontext())
        with torch.inference_mode() if inference_mode else torch.no_grad(), caching as counted:
            pixels = pipe(**kwargs, num_images_per_prompt=len(seeds),
                          generator=[torch.Generator("cpu").manual_seed(s) for s in seeds]).images
            images = pil_images(pixels)
        if counted is not None:
            passes[0] += counted.full
            passes[1] += counted.passes
        marks["base"] += spec.steps
        return images

    tiling = choose_tiling(tier_may_tile, spec.width, spec.height)
    if tiling.applied == "on":
        pipe.vae.enable_tiling()
    elif tier_may_tile:
        pipe.vae.disable_tiling()
    check("first")
    timer = _EncodeTimer(pipe)
    points = _CancelPoints(pipe, family.denoiser, check)
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    on_phase("encoding_prompt")
    if prompts is not None:
        prompts.counts()  # this generation's hits and misses from here
    graphs_before = _graphs_traced()
    try:
        images, split = oom_backoff.run_in_batches(call, spec.seeds, spec.width, spec.height, per_call=per_call)
    finally:
        timer.close()
        points.close()
    t_end = time.perf_counter()
    new_graphs = _graphs_traced() - graphs_before
    encode = (timer.end - timer.start) if timer.start and timer.end else 0.0
    first = marks["first_step"] or t_call
    last = marks["last_step"] or first
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    cached = step_cache.record(spec.step_cache, *passes) if spec.step_cache is not None else None
    counts = prompts.counts() if prompts is not None else (0, 0)
    encoded = prompts.record(*counts) if prompts is not None else None
    retrace = None
    if new_graphs:
        retrace = Resolved("compile_trace", "", "traced again", Source.AUTO, Status.APPLIED,
                           f"{len(spec.seeds)} image(s) at {spec.width}x{spec.height}: the compiled graphs did not "
                           f"cover this call, and {new_graphs} new graph(s) were traced (within this generation's time)")
    return GenerationOutput(list(images), encode, last - first, t_end - last, peak, tiling, cached, encoded, counts,
                            split, retrace, new_graphs, batch_plan.record(len(spec.seeds), spec.width, spec.height,
                                                                        spec.pixels_per_call))


class _StepPace:
    """Keeps the host at most one step ahead of the GPU. The host queues a step's kernels (one launch per step when
    a graph replays them) far faster than the GPU runs them, so unpaced it would queue a whole generation at once:
    its progress would say every step was done while they waited in the queue, a cancel or a lost lease would be
    seen only after all of them ran, and the denoise time would end when the last step was queued (the decode's
    carrying the rest). At each step's end it records an event and waits for the previous step's, so one step
    stays queued (the GPU does not idle between steps); at a call's last step it waits for the device."""

    def __init__(self):
        self.previous = None

    def __call__(self, latents, last: bool) -> None:
        import torch

        if not (torch.is_tensor(latents) and latents.is_cuda):
            return
        if last:
            torch.cuda.synchronize(latents.device)
            self.previous = None
            return
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(latents.device))
        if self.previous is not None:
            self.previous.synchronize()
        self.previous = event


def _graphs_traced() -> int:
    """Graphs dynamo has compiled in this process so far (its own counter; the GPU worker is the only caller)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


__all__ = ["GenerationSpec", "parse_generate", "run", "pil_images", "RunControl", "StepReport", "GenerationOutput", "Status"]
