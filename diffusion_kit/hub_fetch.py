"""Hugging Face repos: the scoped file list a pipeline needs, the download, and the checks around it.

Only the components the pipeline loads are fetched, in safetensors; HF_HUB_OFFLINE is honoured
(the local cache alone); free disk is checked before a byte is fetched; and the files are verified
on disk before anyone may load them. Shared by the inference service (loads) and the training
service (bases).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from diffusion_kit.download_progress import GrowthWatcher
from diffusion_kit.hub_files import FileChoice, choose_files
from service_kit.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, ResourceExhausted, \
    clip

WEIGHT_PATTERNS = ("*.safetensors", "*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")


def hub_allow_patterns(model_index: dict) -> list[str]:
    """The scoped file list: model_index.json plus the folders of the components the pipeline loads."""
    patterns = ["model_index.json"]
    for name, spec in model_index.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        patterns += [f"{name}/{p}" for p in WEIGHT_PATTERNS]
    return patterns


def check_repo_id(repo_id: str) -> None:
    """owner/name, by huggingface_hub's own rule (its HFValidationError would otherwise escape as a bug)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if "/" not in repo_id or repo_id.count("/") > 1:
        raise InvalidArgument(f"hub repo ids look like owner/name, got {clip(repo_id)}", reason="BAD_REPO_ID")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise InvalidArgument(f"hub repo id {clip(repo_id)} is not valid: {str(e)[:200]}", reason="BAD_REPO_ID") from None


@contextlib.contextmanager
def hub_errors(repo_id: str, revision: str | None):
    """huggingface_hub's failures as the service's errors, each with what to do about it."""
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, HFValidationError, \
        LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        yield
    except GatedRepoError as e:  # a RepositoryNotFoundError too: first
        raise PermissionDenied(
            f"hub repo {repo_id} is gated: accept its terms on the hub with an account, and give this service that "
            "account's token (HF_TOKEN in its environment, or HF_TOKEN_PATH naming a file)",
            reason="GATED_REPO", metadata={"repo_id": repo_id}) from e
    except HFValidationError as e:
        raise InvalidArgument(f"hub repo {repo_id} or revision {clip(revision)} is not valid: {str(e)[:200]}",
                              reason="BAD_REPO_ID") from e
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise NotFound(f"hub repo {repo_id} (revision {revision or 'default'}) was not found (a private repo "
                       f"answers so without a token: set HF_TOKEN in the service's environment): {e}",
                       reason="REPO_NOT_FOUND") from e
    except LocalEntryNotFoundError as e:
        raise NotFound(f"hub repo {repo_id} is not in the local cache and HF_HUB_OFFLINE is set",
                       reason="NOT_CACHED_OFFLINE") from e
    except EntryNotFoundError as e:
        raise InvalidArgument(f"hub repo {repo_id} is not a diffusers pipeline: {e}", reason="NOT_A_PIPELINE") from e
    except OSError as e:
        raise FailedPrecondition(f"could not download {repo_id}: {e}", reason="DOWNLOAD_FAILED") from e


def fetch_small(repo_id: str, revision: str | None, filename: str) -> Path:
    """One small file (model_index.json, a config), from the cache or the hub: for preflights."""
    from huggingface_hub import hf_hub_download

    check_repo_id(repo_id)
    with hub_errors(repo_id, revision):
        return Path(hf_hub_download(repo_id, filename, revision=revision, local_files_only=offline()))


@dataclass(frozen=True)
class HubPlan:
    """What a hub load will fetch, known before any weight byte moves: the files, their bytes, and each
    component's parameter count read from the safetensors headers on the hub (byte ranges, not the files)."""
    repo_id: str
    revision: str | None
    variant: str
    index_dir: Path  # the cached snapshot folder holding model_index.json
    choice: FileChoice | None  # None offline: the local cache alone decides
    params: dict[str, int]  # per component; empty offline


def plan_hub_download(repo_id: str, revision: str | None, variant: str = "") -> HubPlan:
    """The repo's listing through huggingface_hub's dry run, the files of one variant, and their parameters."""
    from huggingface_hub import HfApi, snapshot_download

    check_repo_id(repo_id)
    index_path = fetch_small(repo_id, revision, "model_index.json")
    if offline():
        return HubPlan(repo_id, revision, variant, index_path.parent, None, {})
    with hub_errors(repo_id, revision):
        listing = snapshot_download(repo_id, revision=revision, dry_run=True)
        choice = choose_files([(f.filename, f.file_size) for f in listing], json.loads(index_path.read_text()),
                              variant)
        params: dict[str, int] = {}
        api = HfApi()
        for name in choice.files:
            if name.endswith(".safetensors"):
                header = api.parse_safetensors_file_metadata(repo_id, name, revision=revision)
                component = name.split("/", 1)[0]
                params[component] = params.get(component, 0) + sum(header.parameter_count.values())
    return HubPlan(repo_id, revision, variant, index_path.parent, choice, params)


def fetch_planned(plan: HubPlan, *, download: Callable | None = None,
                  on_progress: Callable[[int, int], None] | None = None) -> Path:
    """Downloads exactly the planned files (offline: the local cache alone); verifies them on disk."""
    from huggingface_hub import snapshot_download

    snapshot = download or snapshot_download
    repo_id, revision = plan.repo_id, plan.revision
    with hub_errors(repo_id, revision):
        if plan.choice is None:
            patterns = hub_allow_patterns(json.loads((plan.index_dir / "model_index.json").read_text()))
            root = Path(snapshot(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True))
        else:
            from huggingface_hub import constants
            from huggingface_hub.file_download import repo_folder_name

            need = plan.choice.total_bytes
            check_disk(Path(constants.HF_HUB_CACHE), int(need * 1.05))
            folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
            with GrowthWatcher(folder, need, on_progress or (lambda done, total: None)):
                root = Path(snapshot(repo_id, revision=revision, allow_patterns=list(plan.choice.files)))
    verify_snapshot(root)
    return root


def fetch_hub_repo(repo_id: str, revision: str | None, variant: str = "", *, download: Callable | None = None,
                   on_progress: Callable[[int, int], None] | None = None) -> Path:
    """Plans and fetches in one go (where nothing needs checking in between)."""
    return fetch_planned(plan_hub_download(repo_id, revision, variant), download=download, on_progress=on_progress)


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


def check_disk(path: Path, need_bytes: int) -> None:
    """Disk preflight: before a download, never half-way through it."""
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise ResourceExhausted(f"{path} has {free / 2**30:.1f} GiB free, {need_bytes / 2**30:.1f} GiB needed",
                                reason="DISK_FULL")
