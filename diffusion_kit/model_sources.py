"""Where a model's weights are, as typed values: the services' ModelSource messages converted at the edge.

Which of them a service accepts, and how a path is confined and checked, is the service's own
decision (inference: `inference_service/model_source.py`; training: `training_service/training_plan.py`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LocalDir:
    path: str


@dataclass(frozen=True)
class HubRepo:
    repo_id: str
    revision: str | None = None
    variant: str = ""  # "" : the plain weights


@dataclass(frozen=True)
class SingleFile:
    """A single-file denoiser checkpoint; `companions` holds the text encoders, VAE and configs."""
    path: str
    companions: "LocalDir | HubRepo | SingleFile | GgufFile | None" = None


@dataclass(frozen=True)
class GgufFile:
    """A GGUF denoiser; `base` holds the rest of the pipeline."""
    path: str
    base: "LocalDir | HubRepo | SingleFile | GgufFile | None" = None


ModelSource = LocalDir | HubRepo | SingleFile | GgufFile


def from_proto(msg) -> ModelSource | None:
    """A ModelSource message as a typed source; None when none is set."""
    kind = msg.WhichOneof("source")
    if kind == "local_dir":
        return LocalDir(msg.local_dir)
    if kind == "hub_repo":
        return HubRepo(msg.hub_repo.repo_id, msg.hub_repo.revision or None, msg.hub_repo.variant)
    if kind == "single_file":
        return SingleFile(msg.single_file.path, from_proto(msg.single_file.companions))
    if kind == "gguf":
        return GgufFile(msg.gguf.path, from_proto(msg.gguf.base))
    return None


def kind_of(source: ModelSource | None) -> str:
    """The ModelSource field name of a typed source ("local_dir", ...), or "unset"."""
    return {LocalDir: "local_dir", HubRepo: "hub_repo", SingleFile: "single_file", GgufFile: "gguf"}.get(
        type(source), "unset")
