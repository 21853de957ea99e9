"""Where a model's files are, what family they hold and how big they are: checked before any GPU is asked for.

Local paths must resolve inside the model roots (diffusion_kit.path_roots) before anything looks at
them; every safetensors file's header is checked whole (diffusion_kit.weights_on_disk). Hub repos go
through diffusion_kit.hub_fetch (scoped, offline-aware, verified on disk).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from diffusion_kit.families import FamilySpec, check_pipeline_dir, family_from_proto
from diffusion_kit.gguf_check import check_gguf
from diffusion_kit.hub_fetch import fetch_hub_repo
from diffusion_kit.path_roots import Roots
from diffusion_kit.weights_on_disk import component_params, safetensors_params
from service_kit.errors import InvalidArgument, NotFound

TARGET_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


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

    def footprint_bytes(self, dtype: str, denoiser_bits: float | None = None) -> tuple[int, int]:
        """(whole pipeline, largest component) bytes at the compute dtype; a quantised denoiser counts its bits."""
        per = {}
        for name, count in self.params.items():
            bits = denoiser_bits if (name == self.family.denoiser and denoiser_bits) else TARGET_BYTES[dtype] * 8
            per[name] = int(count * bits / 8)
        return sum(per.values()), max(per.values(), default=0)


def resolve_source(source, requested_family: int, roots: Roots, *, download: Callable | None = None,
                   on_progress: Callable[[int, int], None] | None = None, field: str = "source") -> SourceFiles:
    """Checks a ModelSource and returns where its files are.

    PERMISSION_DENIED for a path outside the model roots (before any existence check), then NOT_FOUND /
    INVALID_ARGUMENT with the fix."""
    kind = source.WhichOneof("source")
    if kind is None:
        raise InvalidArgument("source is required: local_dir, hub_repo, single_file or gguf", reason="MISSING_SOURCE")
    if kind == "local_dir":
        pipeline_dir = roots.confine(source.local_dir, f"{field}.local_dir")
        family = check_pipeline_dir(pipeline_dir, "local_dir")
        roots.confine_tree(pipeline_dir, f"{field}.local_dir")
        files = SourceFiles("local_dir", pipeline_dir, family, describe=str(pipeline_dir))
    elif kind == "hub_repo":
        pipeline_dir = fetch_hub_repo(source.hub_repo.repo_id, source.hub_repo.revision or None,
                                      download=download, on_progress=on_progress)
        family = check_pipeline_dir(pipeline_dir, f"hub repo {source.hub_repo.repo_id}")
        files = SourceFiles("hub_repo", pipeline_dir, family, describe=source.hub_repo.repo_id)
    else:
        spec = getattr(source, kind)
        weight = roots.confine(spec.path, f"{field}.{kind}.path")
        suffix = ".safetensors" if kind == "single_file" else ".gguf"
        if not weight.is_file():
            raise NotFound(f"{kind} {weight} does not exist", reason="MODEL_NOT_FOUND", metadata={"path": str(weight)})
        if weight.suffix != suffix:
            raise InvalidArgument(f"{kind} wants a {suffix} file, got {weight.name}", reason="WRONG_FILE_TYPE")
        base_msg = spec.companions if kind == "single_file" else spec.base
        if base_msg.WhichOneof("source") is None:
            if kind == "gguf" or requested_family == 0:
                raise InvalidArgument(f"{kind} needs {'base' if kind == 'gguf' else 'companions'} (a diffusers "
                                      "pipeline for the text encoders, VAE and configs)", reason="MISSING_BASE")
            base_msg = _default_base(requested_family)
        if base_msg.WhichOneof("source") not in ("local_dir", "hub_repo"):
            raise InvalidArgument("the base of a single-file or GGUF load must be a local_dir or hub_repo",
                                  reason="BAD_BASE")
        base = resolve_source(base_msg, requested_family, roots, download=download, on_progress=on_progress,
                              field=f"{field}.{kind}.{'companions' if kind == 'single_file' else 'base'}")
        if kind == "gguf":
            check_gguf(weight)
        files = SourceFiles(kind, base.pipeline_dir, base.family, denoiser_file=weight,
                            describe=f"{weight} + {base.describe}")
    if requested_family and requested_family != files.family.proto:
        asked = family_from_proto(requested_family).display
        raise InvalidArgument(f"family {asked} was asked for but {files.describe} holds {files.family.display}",
                              reason="FAMILY_MISMATCH")
    params = component_params(files.pipeline_dir)
    if files.denoiser_file is not None and files.denoiser_file.suffix == ".safetensors":
        params[files.family.denoiser] = safetensors_params(files.denoiser_file)
    stored = sum(p.stat().st_size for p in files.pipeline_dir.rglob("*.safetensors"))
    return SourceFiles(files.kind, files.pipeline_dir, files.family, files.denoiser_file, files.describe, params, stored)


def _default_base(requested_family: int):
    from diffusion.v1 import inference_pb2

    family = family_from_proto(requested_family)
    return inference_pb2.ModelSource(hub_repo=inference_pb2.HubRepo(repo_id=family.default_repo))
