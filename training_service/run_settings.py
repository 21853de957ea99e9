"""Everything a StartTraining request leaves to the service, resolved once, before a job exists.

A pure function of the request, the host's probes and the already-resolved base precision. It
returns the recipe's settings and one Resolved record per control, so the first event of a job
says exactly what will run; anything impossible is refused here, before the broker is asked.
"""
from __future__ import annotations

from dataclasses import dataclass

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb  # the Optimizer and LrSchedule values only
from diffusion_kit.families import FamilySpec
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.precision import Precision
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import FailedPrecondition, InvalidArgument
from training_service.attention_choice import CUDNN_FIRST, training_attention
from training_service.graph_choice import training_graphs
from training_service.optimizer_choice import optimizer_choice
from training_service.requests import StartTraining

SCHEDULES = {pb.LR_SCHEDULE_CONSTANT: "constant", pb.LR_SCHEDULE_CONSTANT_WITH_WARMUP: "constant_with_warmup",
             pb.LR_SCHEDULE_LINEAR: "linear", pb.LR_SCHEDULE_COSINE: "cosine"}
OPTIMIZERS = {pb.OPTIMIZER_ADAMW: "adamw", pb.OPTIMIZER_ADAMW_8BIT: "adamw8bit"}
MAX_BATCH = 64
MAX_ACCUMULATION = 64
MAX_SAMPLE_PROMPTS = 8


@dataclass(frozen=True)
class RunSettings:
    device: str
    precision: Precision  # how the frozen base is held
    optimizer: str
    lr_schedule: str
    compile: bool
    gradient_checkpointing: bool
    attention: tuple[str, ...]  # SDPA kernels the step pins (attention_choice)
    cuda_graphs: bool  # the blocks replay as CUDA graphs (graph_choice)
    batch_size: int
    accumulation: int
    buckets: bool
    sample_every: int
    sample_prompts: tuple[str, ...]
    resolved: tuple[Resolved, ...]


def _name(enum, value: int) -> str:
    return enum.Name(value)


def resolve_run(req: StartTraining, caps: HostCaps, family: FamilySpec, precision: Precision,
                precision_record: Resolved, first_caption: str) -> RunSettings:
    resolved = [precision_record]
    device = caps.torch_device

    optimizer = OPTIMIZERS.get(req.optimizer, "adamw")
    if optimizer == "adamw8bit" and not caps.adamw8bit:
        raise FailedPrecondition(f"OPTIMIZER_ADAMW_8BIT is unavailable on this host ({caps.adamw8bit_reason}); "
                                 "use OPTIMIZER_ADAMW", reason="OPTIMIZER_UNAVAILABLE")
    resolved.append(Resolved("optimizer", _name(pb.Optimizer, req.optimizer), optimizer,
                             Source.EXPLICIT if req.optimizer else Source.DEFAULT,
                             reason=optimizer_choice(optimizer, device).reason))

    schedule = SCHEDULES.get(req.lr_schedule, "constant_with_warmup")
    resolved.append(Resolved("lr_schedule", _name(pb.LrSchedule, req.lr_schedule),
                             f"{schedule} ({req.warmup_steps} warmup steps)",
                             Source.EXPLICIT if req.lr_schedule else Source.DEFAULT))

    wants_compile = req.speed_mode in (c.SPEED_MODE_DEFAULT, c.SPEED_MODE_MAX)
    asked = _name(c.SpeedMode, req.speed_mode)
    if not wants_compile:
        slow = ("float8 casts are not fused without compile, so fp8 eager trains far slower than bf16 eager "
                "(measured: docs/bench/training.md); use SPEED_MODE_DEFAULT" if precision == Precision.FP8
                else "")
        resolved.append(Resolved("speed_mode", asked, "eager", Source.EXPLICIT if req.speed_mode else Source.DEFAULT,
                                 reason=slow))
        compile_ = False
    elif not precision.facts.training_compiles:
        # int8 (torchao weight-only) runs eager, where it measured fastest.
        resolved.append(Resolved("speed_mode", asked, "eager", Source.EXPLICIT, Status.UNSUPPORTED,
                                 f"{precision.proto_name} bases train eager (torchao weight-only kernels); "
                                 "choose PRECISION_BF16, PRECISION_FP8 or PRECISION_NF4 to compile"))
        compile_ = False
    else:
        compile_ = True
    speed_max = req.speed_mode == c.SPEED_MODE_MAX
    attention = training_attention(family.key, device, speed_max=speed_max, precision=precision.value,
                                   compiled=compile_, checkpointing=req.gradient_checkpointing)
    graphs = training_graphs(family.key, device, speed_max=speed_max, precision=precision.value, compiled=compile_,
                             checkpointing=req.gradient_checkpointing,
                             accumulation=req.gradient_accumulation_steps or 1, batch_size=req.batch_size or 1)
    if compile_:
        status, reason = Status.APPLIED, "regional compile of the repeated blocks, dynamic shapes"
        cudnn = ("; MAX adds cuDNN attention first (see attention)" if speed_max and attention.kernels == CUDNN_FIRST
                 else "")
        if graphs.on:
            reason = f"regional compile of the repeated blocks; {graphs.reason}{cudnn}"
        elif cudnn:
            reason += f"{cudnn}; no CUDA graphs: {graphs.reason}"
        elif speed_max:
            status, reason = Status.FELL_BACK, (
                "the default compile: MAX adds cuDNN attention on Z-Image's bf16 step and CUDA graphs on FLUX.1's "
                f"and Z-Image's, without gradient checkpointing (CUDA graphs: {graphs.reason}); autotuning is not "
                "applied")
        resolved.append(Resolved("speed_mode", asked, "regional_compile+cuda_graphs" if graphs.on else
                                 "regional_compile", Source.EXPLICIT, status, reason))

    checkpointing = str(req.gradient_checkpointing).lower()
    interval = req.gradient_checkpointing_interval
    resolved.append(Resolved(
        "gradient_checkpointing", checkpointing + (f", interval {interval}" if interval else ""),
        checkpointing + (f" (1 block call in every {interval})" if req.gradient_checkpointing and interval > 1 else ""),
        Source.EXPLICIT if req.gradient_checkpointing else Source.DEFAULT))
    resolved.append(Resolved("attention", "", attention.describe(), Source.AUTO, reason=attention.reason))

    if req.batch_size > MAX_BATCH:
        raise InvalidArgument(f"batch_size is at most {MAX_BATCH}, got {req.batch_size}", reason="BAD_VALUE")
    if not 0 <= req.gradient_accumulation_steps <= MAX_ACCUMULATION:
        raise InvalidArgument(f"gradient_accumulation_steps is 0 to {MAX_ACCUMULATION}, got "
                              f"{req.gradient_accumulation_steps}", reason="BAD_VALUE")
    batch, accumulation = req.batch_size or 1, req.gradient_accumulation_steps or 1
    resolved.append(Resolved("effective_batch", f"{req.batch_size} x {req.gradient_accumulation_steps}",
                             f"{batch * accumulation} ({batch} per pass x {accumulation} accumulated)",
                             Source.EXPLICIT if req.batch_size or req.gradient_accumulation_steps else Source.DEFAULT))
    buckets = req.aspect_ratio_buckets
    resolved.append(Resolved("aspect_ratio_buckets", str(buckets).lower(), str(buckets).lower(),
                             Source.EXPLICIT if buckets else Source.DEFAULT))

    if req.sample_every < 0:
        raise InvalidArgument(f"sample_every must be >= 0, got {req.sample_every}", reason="BAD_VALUE")
    if len(req.sample_prompts) > MAX_SAMPLE_PROMPTS:
        raise InvalidArgument(f"at most {MAX_SAMPLE_PROMPTS} sample_prompts, got {len(req.sample_prompts)}",
                              reason="BAD_VALUE")
    prompts = tuple(p for p in req.sample_prompts if p.strip()) or ((first_caption,) if req.sample_every else ())
    if req.sample_every:
        resolved.append(Resolved("sample_prompts", str(len(req.sample_prompts)), f"{len(prompts)} every "
                                 f"{req.sample_every} steps", Source.EXPLICIT if req.sample_prompts else Source.DEFAULT,
                                 reason="" if req.sample_prompts else "no sample_prompts: the first caption"))

    return RunSettings(device=device, precision=precision, optimizer=optimizer,
                       lr_schedule=schedule, compile=compile_, gradient_checkpointing=req.gradient_checkpointing,
                       attention=attention.kernels, cuda_graphs=graphs.on,
                       batch_size=batch, accumulation=accumulation, buckets=buckets, sample_every=req.sample_every,
                       sample_prompts=prompts, resolved=tuple(resolved))
