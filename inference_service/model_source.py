"""Where a model's files are, what family they hold and how big they are: checked before any GPU is asked for.

Local paths must resolve inside the model roots (diffusion_kit.path_roots) before anything looks at
them; every safetensors file's header is checked whole (diffusion_kit.weights_on_disk). Hub repos go
through diffusion_kit.hub_fetch (scoped, offline-aware, verified on disk).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from diffusion_kit.families import FamilySpec, check_pipeline_dir
from diffusion_kit.gguf_check import check_gguf
from diffusion_kit.hub_fetch import HubPlan, fetch_planned, plan_hub_download
from diffusion_kit.path_roots import Roots
from diffusion_kit.precision import Precision
from diffusion_kit.weights_on_disk import component_params, safetensors_params
from diffusion_kit.model_sources import HubRepo, LocalDir, ModelSource, SingleFile
from service_kit.errors import InvalidArgument, NotFound


@dataclass(frozen=True)
class SourceFiles:
    kind: str  # local_dir | hub_repo | single_file | gguf
    pipeline_dir: Path  # the diffusers directory holding configs and companions
    family: FamilySpec
    denoiser_file: Path | None = None  # single-file or GGUF denoiser replacing the directory's own
    describe: str = ""
    # Parameter counts per component, read from safetensors headers (no weights loaded).
    params: dict[str, int] = field(default_factory=dict)
    stored_bytes: int = 0
    variant: str = ""  # the hub weight variant fetched ("" plain): from_pretrained loads that one

    def footprint_bytes(self, dtype: Precision, denoiser_bits: float | None = None) -> tuple[int, int]:
        """(whole pipeline, largest component) bytes at the compute dtype; a quantised denoiser counts its bits."""
        per = {}
        dense_bits = Precision(dtype).facts.inference_bits
        for name, count in self.params.items():
            bits = denoiser_bits if (name == self.family.denoiser and denoiser_bits) else dense_bits
            per[name] = int(count * bits / 8)
        return sum(per.values()), max(per.values(), default=0)


def resolve_source(source: ModelSource | None, requested_family: FamilySpec | None, roots: Roots, *,
                   download: Callable | None = None, on_progress: Callable[[int, int], None] | None = None,
                   field: str = "source", before_download: Callable[["SourceFiles"], None] | None = None,
                   ) -> SourceFiles:
    """Checks a source and returns where its files are.

    PERMISSION_DENIED for a path outside the model roots (before any existence check), then NOT_FOUND /
    INVALID_ARGUMENT with the fix. A hub repo is planned first (files, bytes, parameters from the hub's headers)
    and `before_download` sees that plan as SourceFiles, so a load that cannot fit is refused before any weight
    byte moves."""
    if source is None:
        raise InvalidArgument("source is required: local_dir, hub_repo, single_file or gguf", reason="MISSING_SOURCE")
    if isinstance(source, LocalDir):
        pipeline_dir = roots.confine(source.path, f"{field}.local_dir")
        family = check_pipeline_dir(pipeline_dir, "local_dir")
        roots.confine_tree(pipeline_dir, f"{field}.local_dir")
        files = SourceFiles("local_dir", pipeline_dir, family, describe=str(pipeline_dir))
    elif isinstance(source, HubRepo):
        plan = plan_hub_download(source.repo_id, source.revision, source.variant)
        if before_download is not None and plan.params:
            family = check_pipeline_dir(plan.index_dir, f"hub repo {source.repo_id}")
            before_download(_planned(plan, family))
        pipeline_dir = fetch_planned(plan, download=download, on_progress=on_progress)
        family = check_pipeline_dir(pipeline_dir, f"hub repo {source.repo_id}")
        files = SourceFiles("hub_repo", pipeline_dir, family, describe=source.repo_id, variant=source.variant)
    else:
        kind, base_name = ("single_file", "companions") if isinstance(source, SingleFile) else ("gguf", "base")
        weight = roots.confine(source.path, f"{field}.{kind}.path")
        suffix = ".safetensors" if kind == "single_file" else ".gguf"
        if not weight.is_file():
            raise NotFound(f"{kind} {weight} does not exist", reason="MODEL_NOT_FOUND", metadata={"path": str(weight)})
        if weight.suffix != suffix:
            raise InvalidArgument(f"{kind} wants a {suffix} file, got {weight.name}", reason="WRONG_FILE_TYPE")
        base = getattr(source, base_name)
        if base is None:
            if kind == "gguf" or requested_family is None:
                raise InvalidArgument(f"{kind} needs {base_name} (a diffusers pipeline for the text encoders, VAE "
                                      "and configs)", reason="MISSING_BASE")
            base = HubRepo(requested_family.default_repo)
        if not isinstance(base, (LocalDir, HubRepo)):
            raise InvalidArgument("the base of a single-file or GGUF load must be a local_dir or hub_repo",
                                  reason="BAD_BASE")
        base_files = resolve_source(base, requested_family, roots, download=download, on_progress=on_progress,
                                    field=f"{field}.{kind}.{base_name}")  # companions: sized once on disk
        if kind == "gguf":
            check_gguf(weight)
        files = SourceFiles(kind, base_files.pipeline_dir, base_files.family, denoiser_file=weight,
                            describe=f"{weight} + {base_files.describe}")
    if requested_family is not None and requested_family.key != files.family.key:
        raise InvalidArgument(f"family {requested_family.display} was asked for but {files.describe} holds "
                              f"{files.family.display}", reason="FAMILY_MISMATCH")
    params = component_params(files.pipeline_dir, files.variant)
    if files.denoiser_file is not None and files.denoiser_file.suffix == ".safetensors":
        params[files.family.denoiser] = safetensors_params(files.denoiser_file)
    stored = sum(p.stat().st_size for p in files.pipeline_dir.rglob("*.safetensors"))
    return SourceFiles(files.kind, files.pipeline_dir, files.family, files.denoiser_file, files.describe, params, stored,
                       files.variant)


def _planned(plan: HubPlan, family: FamilySpec) -> SourceFiles:
    """A hub source as planned, before its weights are fetched: sized from the hub's safetensors headers."""
    describe = plan.repo_id
    if plan.variant:
        plain = plan.choice.plain_fallbacks if plan.choice else ()
        describe += f", {plan.variant} weights" + (f" (plain for {', '.join(plain)}: no {plan.variant} files)"
                                                   if plain else "")
    return SourceFiles("hub_repo", plan.index_dir, family, describe=describe, params=dict(plan.params),
                       stored_bytes=plan.choice.total_bytes if plan.choice else 0, variant=plan.variant)
