"""Where a model's files are, what family they hold and how big they are: checked before any GPU is asked for.

Hub repos are downloaded with a scoped file list (only the components the pipeline loads,
in safetensors), honour HF_HUB_OFFLINE, and are verified on disk before the load may proceed.
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from diffusion_kit.families import FamilySpec, check_pipeline_dir, family_from_proto
from diffusion_kit.weights_on_disk import component_params, safetensors_params
from inference_service.download_progress import GrowthWatcher
from service_kit.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}
TARGET_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
WEIGHT_PATTERNS = ("*.safetensors", "*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken")


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


def resolve_source(source, requested_family: int, *, download: Callable | None = None,
                   on_progress: Callable[[int, int], None] | None = None) -> SourceFiles:
    """Checks a ModelSource and returns where its files are. Raises NOT_FOUND / INVALID_ARGUMENT with the fix."""
    kind = source.WhichOneof("source")
    if kind is None:
        raise InvalidArgument("source is required: local_dir, hub_repo, single_file or gguf", reason="MISSING_SOURCE")
    if kind == "local_dir":
        pipeline_dir = Path(source.local_dir).expanduser()
        family = check_pipeline_dir(pipeline_dir, "local_dir")
        files = SourceFiles("local_dir", pipeline_dir, family, describe=str(pipeline_dir))
    elif kind == "hub_repo":
        pipeline_dir = fetch_hub_repo(source.hub_repo.repo_id, source.hub_repo.revision or None,
                                      download=download, on_progress=on_progress)
        family = check_pipeline_dir(pipeline_dir, f"hub repo {source.hub_repo.repo_id}")
        files = SourceFiles("hub_repo", pipeline_dir, family, describe=source.hub_repo.repo_id)
    else:
        spec = getattr(source, kind)
        weight = Path(spec.path).expanduser()
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
        base = resolve_source(base_msg, requested_family, download=download, on_progress=on_progress)
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


def hub_allow_patterns(model_index: dict) -> list[str]:
    """The scoped file list: model_index.json plus the folders of the components the pipeline loads."""
    patterns = ["model_index.json"]
    for name, spec in model_index.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        patterns += [f"{name}/{p}" for p in WEIGHT_PATTERNS]
    return patterns


def fetch_hub_repo(repo_id: str, revision: str | None, *, download: Callable | None = None,
                   on_progress: Callable[[int, int], None] | None = None) -> Path:
    """Downloads only what the pipeline loads; offline, uses the local cache alone. Verifies files on disk."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    if "/" not in repo_id or repo_id.count("/") > 1:
        raise InvalidArgument(f"hub repo ids look like owner/name, got {repo_id!r}", reason="BAD_REPO_ID")
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    snapshot = download or snapshot_download
    try:
        index_path = Path(hf_hub_download(repo_id, "model_index.json", revision=revision, local_files_only=offline))
        patterns = hub_allow_patterns(json.loads(index_path.read_text()))
        if offline:
            root = Path(snapshot(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True))
        else:
            from huggingface_hub import HfApi, constants
            from huggingface_hub.file_download import repo_folder_name

            info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
            need = download_bytes([(f.rfilename, f.size or 0) for f in info.siblings], patterns)
            check_disk(Path(constants.HF_HUB_CACHE), int(need * 1.05))
            folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
            with GrowthWatcher(folder, need, on_progress or (lambda done, total: None)):
                root = Path(snapshot(repo_id, revision=revision, allow_patterns=patterns))
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise NotFound(f"hub repo {repo_id} (revision {revision or 'default'}) was not found: {e}",
                       reason="REPO_NOT_FOUND") from e
    except LocalEntryNotFoundError as e:
        raise NotFound(f"hub repo {repo_id} is not in the local cache and HF_HUB_OFFLINE is set", 
                       reason="NOT_CACHED_OFFLINE") from e
    except OSError as e:
        raise FailedPrecondition(f"could not download {repo_id}: {e}", reason="DOWNLOAD_FAILED") from e
    verify_snapshot(root)
    return root


def verify_snapshot(root: Path) -> None:
    """A snapshot is loadable only if every component folder the index names has its weights on disk."""
    index = json.loads((root / "model_index.json").read_text())
    missing = []
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        folder = root / name
        if not folder.is_dir():
            missing.append(name)
        elif spec[1] not in ("FlowMatchEulerDiscreteScheduler", "EulerDiscreteScheduler") and \
                not any(folder.glob("*.json")):
            missing.append(f"{name}/config")
    if missing:
        raise FailedPrecondition(f"download of {root.name} is incomplete: missing {', '.join(missing)}",
                                 reason="INCOMPLETE_DOWNLOAD")


def download_bytes(files: list[tuple[str, int]], patterns: list[str]) -> int:
    """Bytes the scoped download fetches: the repo's files that match the allow patterns."""
    return sum(size for name, size in files if any(fnmatch.fnmatch(name, p) for p in patterns))


def check_disk(path: Path, need_bytes: int) -> None:
    """Disk preflight: before a download, never half-way through it."""
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise ResourceExhausted(f"{path} has {free / 2**30:.1f} GiB free, {need_bytes / 2**30:.1f} GiB needed",
                                reason="DISK_FULL")


