"""A StartTraining request turned into the plan of one job: every check, every default with its record, and
the recipe the trainer child will run, before a job exists or a GPU is asked for. No torch here.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from diffusion_kit.adapter_store import check_adapter_id
from diffusion_kit.families import FamilySpec, check_pipeline_dir
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.hub_fetch import fetch_small
from diffusion_kit.model_sources import HubRepo, LocalDir, kind_of
from diffusion_kit.path_roots import Roots
from diffusion_kit.resolved import Resolved, Source
from diffusion_kit.weights_on_disk import component_params
from service_kit.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from training_service import dataset, precision_policy
from training_service.checkpoint_interval import checked_interval
from training_service.recipe_config import RecipeConfig
from training_service.requests import StartTraining
from training_service.run_settings import resolve_run

MAX_RANK = 512
MAX_STEPS = 1_000_000
MAX_RESOLUTION = 4096
MIN_FREE_DISK = 2 * 2**30  # checkpoints of a rank-16 adapter plus optimizer state, with margin
# The resolutions the step rates in docs/bench/training.md were measured at.
DEFAULT_RESOLUTION = {"flux1": 512, "zimage": 768, "qwen_image": 768, "sdxl": 1024}
DEFAULT_RANK = 16
DEFAULT_LR = 1e-4
DEFAULT_STEPS = 1000


@dataclass(frozen=True)
class TrainingPlan:
    """What StartTraining decided: the recipe (without the service's own settings, which
    JobManager.start adds), what to ask the broker for, and one record per decision."""
    recipe: RecipeConfig
    family: FamilySpec
    need_bytes: int  # what the job asks the broker for: its estimated peak, context and allocator margin
    priority: int
    resume_job_id: str
    resolved: tuple[Resolved, ...]
    request_json: str  # the request as sent, echoed in TrainingJob.request
    device_index: int | None = None  # the broker device the job's lease is asked of; None: any


def is_prequantized(base_dir: Path, family: FamilySpec) -> bool:
    """A bitsandbytes 4-bit base keeps its quantization_config in the denoiser's config.json."""
    config = base_dir / family.denoiser / "config.json"
    if not config.is_file():
        return False
    quant = json.loads(config.read_text()).get("quantization_config") or {}
    return bool(quant.get("load_in_4bit")) or quant.get("quant_method") == "bitsandbytes" and quant.get("bnb_4bit_quant_type")


def resolve(req: StartTraining, caps: HostCaps, output_root: Path, model_roots: Roots | None = None,
            dataset_roots: Roots | None = None) -> TrainingPlan:
    """Every check, in order; the roots confine the base and the dataset (the servicer always passes them)."""
    family = req.family
    if family is None:
        raise InvalidArgument("family is required: FAMILY_FLUX1, FAMILY_ZIMAGE, FAMILY_QWEN_IMAGE or FAMILY_SDXL",
                              reason="BAD_FAMILY")
    hub_repo = None
    if isinstance(req.base, LocalDir):
        base_dir = model_roots.confine(req.base.path, "base.local_dir") if model_roots else \
            Path(req.base.path).expanduser()
        found = check_pipeline_dir(base_dir, "base")
        if model_roots:
            model_roots.confine_tree(base_dir, "base.local_dir")
    elif isinstance(req.base, HubRepo):
        if req.base.variant:
            raise InvalidArgument(f"a training base loads its plain weights; variant {req.base.variant!r} is for "
                                  "inference loads", reason="VARIANT_NOT_FOR_TRAINING", field="base.hub_repo.variant")
        # model_index.json and the denoiser's config only: the job itself fetches the weights.
        hub_repo = (req.base.repo_id, req.base.revision)
        base_dir = fetch_small(*hub_repo, "model_index.json").parent
        found = check_pipeline_dir(base_dir, f"hub repo {hub_repo[0]}")
        fetch_small(*hub_repo, f"{found.denoiser}/config.json")
    else:
        raise InvalidArgument(f"base must be a diffusers pipeline (local_dir or hub_repo), not {kind_of(req.base)}; "
                              "single-file and GGUF checkpoints are for inference", reason="BAD_BASE")
    if found.key != family.key:
        raise InvalidArgument(f"family {family.display} was asked for but {base_dir} holds {found.display}",
                              reason="FAMILY_MISMATCH")
    if req.adapter_id:
        check_adapter_id(req.adapter_id)
    for field, value, low, high in (("rank", req.rank, 0, MAX_RANK), ("steps", req.steps, 0, MAX_STEPS),
                                    ("batch_size", req.batch_size, 0, None), ("warmup_steps", req.warmup_steps, 0, None),
                                    ("checkpoint_every", req.checkpoint_every, 0, None)):
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise InvalidArgument(f"{field} must be {bound}, got {value}", reason="BAD_VALUE")
    if req.steps and req.warmup_steps > req.steps:
        raise InvalidArgument(f"warmup_steps ({req.warmup_steps}) exceeds steps ({req.steps})", reason="BAD_VALUE")
    if req.learning_rate is not None and not 0 < req.learning_rate <= 1:
        raise InvalidArgument(f"learning_rate must be in (0, 1], got {req.learning_rate}", reason="BAD_VALUE")
    if req.alpha is not None and not 0 < req.alpha <= 4 * MAX_RANK:
        raise InvalidArgument(f"alpha must be positive (usually the rank), got {req.alpha}", reason="BAD_VALUE")
    if req.resolution and (req.resolution < 64 or req.resolution > MAX_RESOLUTION or req.resolution % 16):
        raise InvalidArgument(f"resolution must be a multiple of 16 from 64 to {MAX_RESOLUTION}, got {req.resolution}",
                              reason="BAD_RESOLUTION")
    defaults = _Defaults(family)
    rank = defaults.take("rank", req.rank, DEFAULT_RANK)
    alpha = defaults.take("alpha", req.alpha, float(rank), "the rank")
    learning_rate = defaults.take("learning_rate", req.learning_rate, DEFAULT_LR)
    steps = defaults.take("steps", req.steps, DEFAULT_STEPS)
    resolution = defaults.take("resolution", req.resolution, DEFAULT_RESOLUTION[family.key],
                               f"{family.display}'s training default")
    prequantized = is_prequantized(base_dir, family)
    params = component_params(base_dir).get(family.denoiser)  # None for a hub base not yet fetched: the nominal size
    interval = checked_interval(req.gradient_checkpointing, req.gradient_checkpointing_interval)
    shape = precision_policy.StepShape(resolution, req.batch_size or 1, req.gradient_checkpointing, interval)
    precision, record = precision_policy.resolve(req.base_precision, caps, family, caps.free_bytes, prequantized,
                                                 shape, params)
    need = precision_policy.lease_bytes(precision_policy.check_fits(caps, family, precision, params, shape), caps)
    examples = dataset.discover(req.image_dir, req.instance_prompt, dataset_roots)
    run = resolve_run(req, caps, family, precision, record, examples[0].caption)
    check_output(output_root)
    recipe = RecipeConfig(
        family=family.key, base_dir=str(base_dir), examples=[(str(e.image), e.caption) for e in examples],
        rank=rank, alpha=alpha, learning_rate=learning_rate, steps=steps, resolution=resolution, seed=req.seed,
        warmup_steps=req.warmup_steps, device=run.device, precision=run.precision, optimizer=run.optimizer,
        lr_schedule=run.lr_schedule, batch_size=run.batch_size, accumulation=run.accumulation, buckets=run.buckets,
        compile=run.compile, gradient_checkpointing=run.gradient_checkpointing, checkpoint_interval=interval,
        attention=list(run.attention),
        cuda_graphs=run.cuda_graphs,
        checkpoint_every=req.checkpoint_every,
        sample_every=run.sample_every, sample_prompts=list(run.sample_prompts),
        dataset_fingerprint=dataset.fingerprint(examples), adapter_id=req.adapter_id,
        trigger_words=list(req.trigger_words), hub_repo=hub_repo)
    return TrainingPlan(recipe, family, need, req.priority, req.resume_job_id,
                        (*run.resolved, *defaults.records), req.as_sent, req.device_index)


class _Defaults:
    """Applies the service's default where a field is unset, and keeps a record of each."""

    def __init__(self, family: FamilySpec):
        self.family = family
        self.records: list[Resolved] = []

    def take(self, control: str, value, default, why: str = "the service default"):
        if value:
            return value
        self.records.append(Resolved(control, "unset", f"{default:g}" if isinstance(default, float) else str(default),
                                     Source.DEFAULT, reason=why))
        return default


def check_output(output_root: Path) -> None:
    try:
        output_root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FailedPrecondition(f"the output location {output_root} cannot be created: {e}",
                                 reason="OUTPUT_NOT_WRITABLE") from e
    if not os.access(output_root, os.W_OK):
        raise FailedPrecondition(f"the output location {output_root} is not writable", reason="OUTPUT_NOT_WRITABLE")
    free = shutil.disk_usage(output_root).free
    if free < MIN_FREE_DISK:
        raise ResourceExhausted(f"{output_root} has {free / 2**30:.1f} GiB free; a run needs {MIN_FREE_DISK / 2**30:.0f}",
                                reason="DISK_FULL")
