"""Every check StartTraining runs before a job exists or a GPU is asked for."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from diffusion.v1 import training_pb2 as pb
from diffusion_kit.adapter_store import check_adapter_id
from diffusion_kit.families import FamilySpec, UnknownFamily, check_pipeline_dir, family_from_proto
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.hub_fetch import fetch_small
from diffusion_kit.path_roots import Roots
from diffusion_kit.precision import Precision
from diffusion_kit.weights_on_disk import component_params
from diffusion_kit.resolved import Resolved
from service_kit.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from training_service import dataset, precision_policy
from training_service.info import DEFAULT_RESOLUTION
from training_service.run_settings import RunSettings, resolve_run

MAX_RANK = 512
MAX_STEPS = 1_000_000
MAX_RESOLUTION = 4096
MIN_FREE_DISK = 2 * 2**30  # checkpoints of a rank-16 adapter plus optimizer state, with margin


@dataclass(frozen=True)
class Preflighted:
    family: FamilySpec
    base_dir: Path
    examples: list[dataset.Example]
    precision: Precision
    precision_record: Resolved
    prequantized: bool
    run: RunSettings
    need_bytes: int  # the job's estimated peak, what it asks the broker for
    hub_repo: tuple[str, str | None] | None = None  # (repo id, revision) when the job must fetch the base


def is_prequantized(base_dir: Path, family: FamilySpec) -> bool:
    """A bitsandbytes 4-bit base keeps its quantization_config in the denoiser's config.json."""
    config = base_dir / family.denoiser / "config.json"
    if not config.is_file():
        return False
    quant = json.loads(config.read_text()).get("quantization_config") or {}
    return bool(quant.get("load_in_4bit")) or quant.get("quant_method") == "bitsandbytes" and quant.get("bnb_4bit_quant_type")


def preflight(req: pb.StartTrainingRequest, caps: HostCaps, output_root: Path, model_roots: Roots | None = None,
              dataset_roots: Roots | None = None) -> Preflighted:
    """Every check, in order; the roots confine the base and the dataset (the servicer always passes them)."""
    try:
        family = family_from_proto(req.family)
    except UnknownFamily as e:
        raise InvalidArgument(f"family is required: {e}", reason="BAD_FAMILY") from e
    kind = req.base.WhichOneof("source")
    hub_repo = None
    if kind == "local_dir":
        base_dir = model_roots.confine(req.base.local_dir, "base.local_dir") if model_roots else \
            Path(req.base.local_dir).expanduser()
        found = check_pipeline_dir(base_dir, "base")
        if model_roots:
            model_roots.confine_tree(base_dir, "base.local_dir")
    elif kind == "hub_repo":
        # model_index.json and the denoiser's config only: the job itself fetches the weights.
        hub_repo = (req.base.hub_repo.repo_id, req.base.hub_repo.revision or None)
        base_dir = fetch_small(*hub_repo, "model_index.json").parent
        found = check_pipeline_dir(base_dir, f"hub repo {hub_repo[0]}")
        fetch_small(*hub_repo, f"{found.denoiser}/config.json")
    else:
        raise InvalidArgument(f"base must be a diffusers pipeline (local_dir or hub_repo), not {kind or 'unset'}; "
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
    if req.HasField("learning_rate") and not 0 < req.learning_rate <= 1:
        raise InvalidArgument(f"learning_rate must be in (0, 1], got {req.learning_rate}", reason="BAD_VALUE")
    if req.HasField("alpha") and not 0 < req.alpha <= 4 * MAX_RANK:
        raise InvalidArgument(f"alpha must be positive (usually the rank), got {req.alpha}", reason="BAD_VALUE")
    if req.resolution and (req.resolution < 64 or req.resolution > MAX_RESOLUTION or req.resolution % 16):
        raise InvalidArgument(f"resolution must be a multiple of 16 from 64 to {MAX_RESOLUTION}, got {req.resolution}",
                              reason="BAD_RESOLUTION")
    prequantized = is_prequantized(base_dir, family)
    params = component_params(base_dir).get(family.denoiser)  # None for a hub base not yet fetched: the nominal size
    shape = precision_policy.StepShape(req.resolution or DEFAULT_RESOLUTION[family.key], req.batch_size or 1,
                                       req.gradient_checkpointing)
    precision, record = precision_policy.resolve(Precision.of_proto(req.base_precision), caps, family, caps.free_bytes,
                                                 prequantized, shape, params)
    need = precision_policy.check_fits(caps, family, precision, params, shape)
    examples = dataset.discover(req.dataset.image_dir, req.dataset.instance_prompt, dataset_roots)
    run = resolve_run(req, caps, family, precision, record, examples[0].caption)
    check_output(output_root)
    return Preflighted(family, base_dir, examples, precision, record, prequantized, run, need, hub_repo)


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
