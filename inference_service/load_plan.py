"""The load plan: a typed LoadRequest and its checked files turned into every decision the torch worker
carries out (dtype, quantisation, memory tier, speed layer), before any GPU is asked for. No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from diffusion_kit.dtype_policy import resolve_compute_dtype
from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.precision import Precision
from diffusion_kit.resolved import Resolved, Source
from inference_service import image_room, step_graphs
from inference_service.keep_alive import resolve_keep_alive
from inference_service.memory_plan import MemoryPlan, need_for, plan_memory
from inference_service.model_source import SourceFiles
from inference_service.quant_policy import QuantChoice, resolve_quant
from inference_service.requests import LoadRequest
from inference_service.speed_plan import OFFLOAD_HOOK_MODES, SpeedPlan, asks_for_compile, plan_speed
from service_kit.errors import InvalidArgument, ResourceExhausted


@dataclass(frozen=True)
class EngineSettings:
    quant_min_features: int = 1024
    compile_backend: str = "inductor"
    warmup_resolution: int = 1024
    lora_max_rank: int = 64  # the compiled model's hotswap slot holds adapters up to this rank
    keep_alive_s: float = -1.0  # --keep-alive: how long an idle model stays loaded when a Load does not say
    busy_linger_s: float = 0.5  # --busy-linger: how long the lease stays marked busy after the queue empties
    prompt_cache_bytes: int = 1 << 30  # --prompt-cache-mib: host memory for repeated prompts' embeddings; 0 off
    aot_blocks_dir: str = ""  # --aot-blocks: where compiled blocks' graphs are kept across processes; "" off
    cuda_graphs: bool = True  # --no-cuda-graphs: compiled denoisers never replay CUDA graphs (step_graphs)


@dataclass
class LoadPlan:
    """Everything the torch worker needs to build the pipeline, and the records that say why."""
    model_id: str
    family: FamilySpec
    source: SourceFiles
    dtype: Precision  # the dense compute dtype
    quant: QuantChoice
    memory: MemoryPlan
    speed: SpeedPlan
    device: str  # "cuda", "cpu", ...
    quant_min_features: int
    compile_backend: str
    warmup_resolution: int
    resolved: list[Resolved] = field(default_factory=list)
    lora_max_rank: int = 64
    footprint_bytes: int = 0
    lease_bytes: int = 0  # what the broker is asked for: the plan's peak on the device, loading included
    quantize_on_device: bool = True  # move the dense weights to the device before quantising them
    keep_alive_s: float | None = None  # idle seconds before the model is unloaded; None: never
    pixels_per_call: int = image_room.MEASURED_PIXELS  # the image room its lease is planned for (image_room)
    aot_dir: str = ""  # compiled loads: where the blocks' ahead-of-time graphs are kept (aot_blocks); "" off
    cuda_graphs: bool = False  # the denoiser's calls replay CUDA graphs (step_graphs)


def check_request(req: LoadRequest) -> None:
    """What the edge's limits leave: a Load must name its model (the pattern is the edge's)."""
    if not req.model_id:
        raise InvalidArgument("model_id is required: 1-128 letters, digits, '.', '_' or '-'", reason="BAD_MODEL_ID")


def plan_load(req: LoadRequest, source: SourceFiles, caps: HostCaps, settings: EngineSettings) -> LoadPlan:
    family = source.family
    dtype, dtype_record = resolve_compute_dtype(req.compute_precision, caps, family)
    fast = req.fp8_fast_accumulate
    device = caps.torch_device
    pixels, room_record = image_room.resolve(req.max_pixels_per_call, family, dtype.facts.inference_bits)

    def sized(compiled: bool):
        quant = resolve_quant(req.transformer_precision, req.text_encoder_precision, fast, caps, family,
                              compiled=compiled)
        # GGUF: a typical Q4; a quantised denoiser keeps its scheme's bits per weight.
        quant_bits = 4.5 if source.kind == "gguf" else quant.transformer.facts.inference_bits if quant.transformer else None
        footprint, largest = source.footprint_bytes(dtype, quant_bits)
        memory = plan_memory(req.memory_mode, device_kind=caps.device_kind, free_bytes=caps.free_bytes,
                             total_bytes=caps.total_bytes, footprint_bytes=footprint, largest_component_bytes=largest,
                             compute_bits=dtype.facts.inference_bits, pixels=pixels)
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
    lease, on_device, where = _quantise_where(source, dtype, quant, memory, caps)
    keep_alive, keep_alive_record = resolve_keep_alive(req.keep_alive_s, settings.keep_alive_s)
    graphs = step_graphs.plan(enabled=settings.cuda_graphs, device_kind=caps.device_kind, compiled=speed.compile,
                              memory_mode=memory.mode)
    resolved = [dtype_record, *quant.resolved, *memory.resolved, room_record, *speed.resolved, graphs, *where,
                keep_alive_record]
    return LoadPlan(model_id=req.model_id, family=family, source=source, dtype=dtype, quant=quant, memory=memory,
                    speed=speed, device=device, quant_min_features=settings.quant_min_features,
                    compile_backend=settings.compile_backend,
                    warmup_resolution=image_room.warmup_side(settings.warmup_resolution, pixels),
                    resolved=resolved, footprint_bytes=footprint, lora_max_rank=settings.lora_max_rank,
                    lease_bytes=lease, quantize_on_device=on_device, keep_alive_s=keep_alive, pixels_per_call=pixels,
                    aot_dir=settings.aot_blocks_dir if speed.compile else "", cuda_graphs=graphs.applied == "on")


def _quantise_where(source: SourceFiles, dtype: Precision, quant: QuantChoice, memory: MemoryPlan,
                    caps: HostCaps) -> tuple[int, bool, tuple[Resolved, ...]]:
    """(bytes to lease, quantise on the device, records). torchao quantises a resident model fastest on the
    device, but the dense weights are all there first: the load peaks at the dense footprint, not the quantised
    one (measured on an H200: an fp8 Z-Image used 24.8 GiB under a 19.8 GiB lease). So the lease covers that
    peak when it fits; when only the quantised model fits, it is quantised on the CPU first (slower, exact)."""
    torchao = quant.transformer is not None and quant.transformer.facts.library == "torchao"
    if memory.mode != "resident" or caps.device_kind == "cpu" or not (torchao or quant.text_encoder):
        return memory.device_bytes, True, ()
    dense_peak = need_for("resident", *source.footprint_bytes(dtype), dtype.facts.inference_bits)
    if dense_peak <= caps.free_bytes:
        return max(memory.device_bytes, dense_peak), True, (Resolved(
            "quantize_on", "auto", "device", Source.AUTO,
            reason=f"the dense weights load first: the lease covers that peak ({dense_peak / 2**30:.1f} GiB)"),)
    return memory.device_bytes, False, (Resolved(
        "quantize_on", "auto", "cpu", Source.AUTO,
        reason=f"the dense weights ({dense_peak / 2**30:.1f} GiB with headroom) do not fit the free memory: "
               "quantised on the CPU before they move (a slower load)"),)
